#!/usr/bin/env bash
# H200 run of 2026-12-04: the build after gpu-wave17.sh, where batch-free sums (parameter
# gradients assembled from padded pieces) no longer count toward `fusion::INLINE_READS_CAP`
# (wave 17's build gave them kernels of their own: 25 more launches in the ViT). The ViT at
# 256 tokens, batch 128, fp32 (profiled) and under a 4.6 GiB budget; then every GPU test,
# five processes side by side (as gpu-wave16.sh). Builds nothing. Summary and logs in $OUT.
. "$(dirname "$0")/gpu-prologue.sh"
OUT=$W CVC_TC_RUNS="vit_sar 128 fp32 default" bash bench/gpu-tc.sh bench >/dev/null
OUT=$W CVC_TC_APPEND=1 CVC_TC_PROFILE=0 CVC_BENCH_BUDGET=4.6GiB CVC_TC_TAG=-budget \
  CVC_TC_RUNS="vit_sar 128 fp32 default" bash bench/gpu-tc.sh bench >/dev/null
cat "$W/summary.txt" >>"$S"; : >"$W/summary.txt"
. bench/gpu-suite.sh
rm -f "$W/b.out"
tar czf "$O/logs.tgz" -C "$W" . 2>/dev/null
grep -v '^{' "$S" | tail -40
