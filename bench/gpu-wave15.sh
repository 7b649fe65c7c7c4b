#!/usr/bin/env bash
# H200 run of 2026-12-03 (night), issues 11 and 13, this build (.gpu/) side by side with the
# build of cc177fa (.gpu-old/):
# 1. speed: the seed network at batch 1024 in bf16, fp16, tf32 and fp32, and the 16-bit
#    kernel choices `frag=lds` (the fragment loads before ldmatrix), `tctile=128` and
#    `tc=prefetch`; the ViT at 256 tokens, batch 128, fp32; JAX's seed step at its default
#    precision;
# 2. correctness of the new 16-bit GEMM (ldmatrix fragments, operands moved bit for bit) and
#    of the reductions (f32 partials of four points, eight outputs per block for kept
#    innermost axes): every example and nine fixtures one step in bf16 and fp16, kernel by
#    kernel against the f64 interpreter (two processes side by side).
# Builds nothing. The summary and one archive of logs in $OUT.
. "$(dirname "$0")/gpu-prologue.sh"
OUT=$W CVC_TC_RUNS="seed_cnn 1024 bf16 default|seed_cnn 1024 fp16 default|seed_cnn 1024 tf32 default|seed_cnn 1024 fp32 default|seed_cnn 1024 bf16 frag=lds|seed_cnn 1024 bf16 tctile=128|seed_cnn 1024 bf16 tc=prefetch" \
  bash bench/gpu-tc.sh bench >/dev/null
OUT=$W CVC_TC_APPEND=1 CVC_GPU_TEST_BIN=.gpu-old/gpu CVC_TC_TAG=-old \
  CVC_TC_RUNS="seed_cnn 1024 bf16 default|seed_cnn 1024 tf32 default|seed_cnn 1024 fp32 default" bash bench/gpu-tc.sh bench >/dev/null
OUT=$W CVC_TC_APPEND=1 CVC_TC_RUNS="vit_sar 128 fp32 default" bash bench/gpu-tc.sh bench >/dev/null
OUT=$W CVC_TC_APPEND=1 CVC_GPU_TEST_BIN=.gpu-old/gpu CVC_TC_TAG=-old CVC_TC_RUNS="vit_sar 128 fp32 default" \
  bash bench/gpu-tc.sh bench >/dev/null
cat "$W/summary.txt" >>"$S"; : >"$W/summary.txt"
PYTHONUNBUFFERED=1 timeout 100 python3 bench/jax_seed_cvnn.py 2>"$W/jax-default.err" | tee -a "$S"
export CVC_PRECISION_FILES=examples/,polsar_unet_tiny,vit_tiny,tuples,gru_tiny,sequence_matmul,volume3d,segmentation_2d,mri_volume_tiny
mkdir -p "$W/bf16" "$W/fp16"
OUT=$W/bf16 CVC_TC_TESTS="default:bf16:1" bash bench/gpu-tc.sh tests &
OUT=$W/fp16 CVC_TC_TESTS="default:fp16:1" bash bench/gpu-tc.sh tests &
wait
cat "$W/bf16/summary.txt" "$W/fp16/summary.txt" >>"$S"
tar czf "$O/logs.tgz" -C "$W" . 2>/dev/null
grep -v '^{' "$S" | tail -45
