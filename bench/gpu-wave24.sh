#!/usr/bin/env bash
# H200 run of 2026-12-04 (third session), the second call: every GPU test on the final build
# in five processes side by side (bench/gpu-suite.sh; the attention test checks the kernels
# fused, `attn_fwd_lse`, and unfused, `attn_lse` + `attn_fwd`), then the examples and fixtures
# forward and backward with the 3M complex products (`CVC_KERNELS=cmul=3m`). Builds nothing;
# summary in $OUT.
. "$(dirname "$0")/gpu-prologue.sh"
CVC_SUITE_LIMIT=${CVC_SUITE_LIMIT:-280}
. bench/gpu-suite.sh
for t in every_example_ every_fixture; do
  CVC_KERNELS=cmul=3m CVC_REQUIRE_GPU=1 timeout 200 .gpu/gpu --test-threads=1 $t >"$W/3m-$t.log" 2>&1 &
done
wait
for t in every_example_ every_fixture; do
  echo "== $t, kernels cmul=3m" | tee -a "$S"
  grep -E "^test |test result" "$W/3m-$t.log" | cut -c1-160 | tee -a "$S"
  grep -h -i -E "mismatch|panicked" "$W/3m-$t.log" | head -6 | cut -c1-300 | tee -a "$S"
done
tar czf "$O/logs.tgz" -C "$W" . 2>/dev/null
grep -E "^== |exit|test result|mismatch|panicked" "$S"
