#!/usr/bin/env bash
# H200 run of 2026-12-03 (evening), issue 13 (call 2 of bench/RESULTS.md). It timed a build
# whose convolution GEMMs ordered K as (kernel tap, channel); that order measured slower and
# was taken out, so the script now measures the current build the same way:
# 1. correctness: every example and nine fixtures one step in tf32, bf16 and fp16, kernel by
#    kernel against the f64 interpreter;
# 2. speed: the seed network at batch 1024 in bf16, fp16, tf32 and fp32, side by side with the
#    build of ac811b7 (.gpu-old/) and JAX at its default precision and in fp32.
# Builds nothing (.gpu/, .gpu-old/). The summary and one archive of logs in $OUT.
set -u
cd "$(dirname "$0")/.."
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
O=${OUT:-/tmp}
W=$(mktemp -d)
S=$O/summary.txt
. bench/gpu-env.sh | tee -a "$S"
export CVC_PRECISION_FILES=examples/,polsar_unet_tiny,vit_tiny,tuples,gru_tiny,sequence_matmul,volume3d,segmentation_2d,mri_volume_tiny
OUT=$W CVC_TC_TESTS="default:tf32,bf16,fp16:1" bash bench/gpu-tc.sh tests
cat "$W/summary.txt" >>"$S"; : >"$W/summary.txt"
OUT=$W CVC_TC_RUNS="seed_cnn 1024 bf16 default|seed_cnn 1024 fp16 default|seed_cnn 1024 tf32 default|seed_cnn 1024 fp32 default" \
  bash bench/gpu-tc.sh bench >/dev/null
OUT=$W CVC_TC_APPEND=1 CVC_GPU_TEST_BIN=.gpu-old/gpu CVC_TC_TAG=-old \
  CVC_TC_RUNS="seed_cnn 1024 bf16 default|seed_cnn 1024 tf32 default|seed_cnn 1024 fp32 default" bash bench/gpu-tc.sh bench >/dev/null
cat "$W/summary.txt" >>"$S"
PYTHONUNBUFFERED=1 timeout 100 python3 bench/jax_seed_cvnn.py 2>"$W/jax-default.err" | tee -a "$S"
PYTHONUNBUFFERED=1 timeout 100 python3 bench/jax_seed_cvnn.py --fp32 2>"$W/jax-fp32.err" | tee -a "$S"
tar czf "$O/logs.tgz" -C "$W" . 2>/dev/null
tail -40 "$S"
