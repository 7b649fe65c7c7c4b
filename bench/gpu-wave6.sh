#!/usr/bin/env bash
# H200 run of 2026-12-03, after the cheap recomputation (remat.rs, aa04c9e):
# 1. the U-Net at batch 6144 side by side, cvc without a budget and PyTorch eager (issue 12's
#    memory target; JAX ran out of memory at this batch on 2026-12-01);
# 2. per-kernel profiles (bench_seed_cnn with CVC_BENCH_FILE): the U-Net at batch 1024 in
#    fp32, the ViT (256 tokens) at batch 128 in fp32 and tf32.
# Builds nothing (.gpu/cvc, .gpu/gpu). One summary file in $OUT.
set -u
cd "$(dirname "$0")/.."
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
. bench/gpu-env.sh >/dev/null
export CVC_GPU_BIN=.gpu
O=${OUT:-/tmp}
S=$O/summary.txt
say() { tee -a "$S"; }
( OUT=/tmp/b6144 timeout 280 bash bench/gpu-unet.sh --batch 6144 --steps 3 --no-train --no-compile --no-jax --peer-timeout 150 2>&1 | tail -5 ) | say
grep -h -E "arena|recomputed" /tmp/b6144/unet/*.plan | head -4 | say
for spec in "examples/polsar_unet.cvnn 1024 fp32 fp32" "examples/vit_sar.cvnn 128 fp32,tf32 fp32"; do
  set -- $spec
  n=$(basename "$1" .cvnn)_$2
  CVC_BENCH_FILE=$1 CVC_BENCH_BATCH=$2 CVC_BENCH_PRECISIONS=$3 CVC_BENCH_PROFILE=$4 CVC_BENCH_STEPS=5 \
    timeout 150 .gpu/gpu bench_seed_cnn --ignored --nocapture --test-threads=1 >"$O/bench-$n.out" 2>"$O/bench-$n.err"
  echo "== $n (exit $?)" | say
  grep -h '^{' "$O/bench-$n.out" | say
  grep -h -E "batch .*: plan" "$O/bench-$n.err" | cut -c1-200 | say
  grep -h -A24 "profile (kernels" "$O/bench-$n.err" | say
done
