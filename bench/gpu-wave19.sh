#!/usr/bin/env bash
# H200 run of 2026-12-04 (second session): the fp32 GEMM's complex products (`cmul=4m|3m`)
# and block tile (`ftile=64|128`), side by side on the ViT at 256 tokens, batch 128, and on
# the seed network at batch 1024 (the default profiled); then the examples and fixtures
# forward and backward against the f64 interpreter with `CVC_KERNELS=$CVC_WAVE_CHECK`
# (default `cmul=3m,ftile=128`). Builds nothing. Summary and logs in $OUT.
. "$(dirname "$0")/gpu-prologue.sh"
v="default|cmul=3m|ftile=128|cmul=3m,ftile=128"
runs=$(for f in "vit_sar 128" "seed_cnn 1024"; do echo "$v" | tr '|' '\n' | sed "s/^/$f fp32 /"; done | paste -sd'|')
OUT=$W CVC_TC_RUNS="$runs" bash bench/gpu-tc.sh bench >/dev/null
cat "$W/summary.txt" >>"$S"; : >"$W/summary.txt"
check=${CVC_WAVE_CHECK:-cmul=3m,ftile=128}
CVC_KERNELS=$check CVC_REQUIRE_GPU=1 timeout 300 .gpu/gpu --test-threads=1 every_example_ >"$W/examples.log" 2>&1 &
CVC_KERNELS=$check CVC_REQUIRE_GPU=1 timeout 300 .gpu/gpu --test-threads=1 every_fixture >"$W/fixtures.log" 2>&1 &
wait
for t in examples fixtures; do
  echo "== $t, kernels $check" | tee -a "$S"
  grep -E "^test |test result" "$W/$t.log" | cut -c1-160 | tee -a "$S"
  grep -h -i -E "mismatch|panicked|error" "$W/$t.log" | head -8 | cut -c1-300 | tee -a "$S"
done
rm -f "$W/b.out"
tar czf "$O/logs.tgz" -C "$W" . 2>/dev/null
grep -v '^{' "$S" | tail -60
