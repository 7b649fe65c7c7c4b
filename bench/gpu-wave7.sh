#!/usr/bin/env bash
# H200 run of 2026-12-03 (afternoon), after the training loop stopped spending host time per
# step (outputs downloaded into reused buffers, the previous step's predictions counted in a
# dense table while the device runs the next step; metrics.jsonl's step_phases_ms):
# 1. the U-Net at batch 6144 side by side, cvc and PyTorch eager (issue 12's step target);
# 2. the U-Net at batch 1024 side by side, cvc, PyTorch eager and JAX;
# 3. the U-Net at batch 6144 with the data resident on the device (bench_seed_cnn), the
#    peers' way of timing, for what remains outside the kernels.
# Builds nothing (.gpu/cvc, .gpu/gpu). One summary file in $OUT.
set -u
cd "$(dirname "$0")/.."
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
. bench/gpu-env.sh >/dev/null
export CVC_GPU_BIN=.gpu
O=${OUT:-/tmp}
S=$O/summary.txt
say() { tee -a "$S"; }
for spec in "6144 3 --no-jax" "1024 10"; do
  set -- $spec
  b=$1 steps=$2; shift 2
  echo "== U-Net batch $b side by side" | say
  ( OUT=/tmp/b$b timeout 220 bash bench/gpu-unet.sh --batch "$b" --steps "$steps" --no-train --no-compile --peer-timeout 120 "$@" 2>&1 | tail -6 ) | say
  grep -h '"tool": "cvc"' /tmp/b$b/unet/cvc.jsonl | say
done
CVC_BENCH_FILE=examples/polsar_unet.cvnn CVC_BENCH_BATCH=6144 CVC_BENCH_PRECISIONS=fp32 CVC_BENCH_PROFILE= CVC_BENCH_STEPS=3 \
  timeout 150 .gpu/gpu bench_seed_cnn --ignored --nocapture --test-threads=1 >"$O/bench-unet6144.out" 2>"$O/bench-unet6144.err"
echo "== data-resident U-Net batch 6144 (exit $?)" | say
grep -h '^{' "$O/bench-unet6144.out" | say
grep -h -E "batch .*: plan" "$O/bench-unet6144.err" | cut -c1-200 | say
