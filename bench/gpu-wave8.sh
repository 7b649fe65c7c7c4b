#!/usr/bin/env bash
# H200 run of 2026-12-03 (afternoon): the 16-bit tensor-core products (issue 13,
# `tc16=native`, mma.sync.m16n8k16) against the TF32 ones at bf16 and fp16:
# 1. correctness: every example and nine fixtures one step in bf16 and fp16, kernel by kernel
#    against the f64 interpreter (operands rounded to the 16-bit format in the bound); the
#    examples in bf16 with `tc=prefetch` (the other staging of 16-bit tiles);
# 2. speed: the seed network at batch 1024, bf16 and fp16 with each choice, tf32 and fp32
#    defaults, side by side with JAX at its default precision.
# Builds nothing (.gpu/gpu). One summary file in $OUT.
set -u
cd "$(dirname "$0")/.."
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
O=${OUT:-/tmp}
S=$O/summary.txt
export CVC_PRECISION_FILES=examples/,polsar_unet_tiny,vit_tiny,tuples,gru_tiny,sequence_matmul,volume3d,segmentation_2d,mri_volume_tiny
CVC_TC_TESTS="default:bf16:1 default:fp16:1 tc=prefetch:bf16:0" bash bench/gpu-tc.sh tests
CVC_TC_RUNS="seed_cnn 1024 bf16 default|seed_cnn 1024 bf16 tc16=tf32|seed_cnn 1024 bf16 tc=prefetch|seed_cnn 1024 fp16 default|seed_cnn 1024 fp16 tc16=tf32|seed_cnn 1024 tf32 default|seed_cnn 1024 fp32 default" \
  bash bench/gpu-tc.sh bench
PYTHONUNBUFFERED=1 timeout 120 python3 bench/jax_seed_cvnn.py 2>"$O/jax-default.err" | tee -a "$S"
