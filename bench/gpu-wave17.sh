#!/usr/bin/env bash
# H200 run of 2026-12-03 (late night), issue 11: sums of the residual stream stored every
# few blocks (`fusion::INLINE_READS_CAP`), this build (.gpu/) side by side with the build of
# c7ed1de (.gpu-old/):
# 1. the ViT at 256 tokens, batch 128: fp32 new and old (profiled), fp32 new under a 4.6 GiB
#    memory budget, tf32 new; JAX's ViT in fp32 and tf32 in the same call; the seed network
#    in bf16 and fp32 (its plan does not change);
# 2. every GPU test on the new build, five processes side by side (as gpu-wave16.sh).
# Builds nothing. The summary and one archive of logs in $OUT.
. "$(dirname "$0")/gpu-prologue.sh"
OUT=$W CVC_TC_RUNS="vit_sar 128 fp32 default" bash bench/gpu-tc.sh bench >/dev/null
OUT=$W CVC_TC_APPEND=1 CVC_GPU_TEST_BIN=.gpu-old/gpu CVC_TC_TAG=-old CVC_TC_RUNS="vit_sar 128 fp32 default" \
  bash bench/gpu-tc.sh bench >/dev/null
OUT=$W CVC_TC_APPEND=1 CVC_TC_PROFILE=0 CVC_BENCH_BUDGET=4.6GiB CVC_TC_TAG=-budget \
  CVC_TC_RUNS="vit_sar 128 fp32 default" bash bench/gpu-tc.sh bench >/dev/null
OUT=$W CVC_TC_APPEND=1 CVC_TC_PROFILE=0 \
  CVC_TC_RUNS="vit_sar 128 tf32 default|seed_cnn 1024 bf16 default|seed_cnn 1024 fp32 default" \
  bash bench/gpu-tc.sh bench >/dev/null
cat "$W/summary.txt" >>"$S"; : >"$W/summary.txt"
for p in fp32 tf32; do
  PYTHONPATH=bench/vit PYTHONUNBUFFERED=1 timeout 150 python3 bench/vit/jax_vit.py --tokens 256 --batch 128 \
    --precision $p --steps 5 2>"$W/jax-vit-$p.err" | tee -a "$S"
done
. bench/gpu-suite.sh
tar czf "$O/logs.tgz" -C "$W" . 2>/dev/null
grep -v '^{' "$S" | tail -60
