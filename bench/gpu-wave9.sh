#!/usr/bin/env bash
# H200 run of 2026-12-03 (afternoon), after the training loop's host work was split over
# threads (runtime/src/par.rs: the gather, the staging copy and the prediction count):
# 1. the U-Net at batch 6144 side by side, cvc and PyTorch eager (issue 12's step target);
# 2. fp16 with the 16-bit tensor-core products, every example and nine fixtures kernel by
#    kernel against the f64 interpreter (the run of bench/gpu-wave8.sh ran out of time there).
# Builds nothing (.gpu/cvc, .gpu/gpu). One summary file in $OUT.
set -u
cd "$(dirname "$0")/.."
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
. bench/gpu-env.sh >/dev/null
export CVC_GPU_BIN=.gpu
O=${OUT:-/tmp}
S=$O/summary.txt
say() { tee -a "$S"; }
echo "== U-Net batch 6144 side by side" | say
( OUT=/tmp/w9 timeout 230 bash bench/gpu-unet.sh --batch 6144 --steps 3 --no-train --no-compile --no-jax --peer-timeout 120 2>&1 | tail -6 ) | say
grep -h '"tool": "cvc"' /tmp/w9/unet/cvc.jsonl | say
CVC_PRECISION_FILES=examples/,polsar_unet_tiny,vit_tiny,tuples,gru_tiny,sequence_matmul,volume3d,segmentation_2d,mri_volume_tiny \
  CVC_PRECISION_LIST=fp16 CVC_PRECISION_FIXTURES=1 CVC_REQUIRE_GPU=1 timeout 330 \
  .gpu/gpu reduced_precision_kernels_match_the_interpreter_within_their_format --test-threads=1 --nocapture >"$O/fp16.log" 2>&1
echo "fp16 tests: exit $? ($(grep -h 'test result' "$O/fp16.log" | cut -c1-90))" | say
grep -h -E "mismatches|panicked" "$O/fp16.log" | head -30 | cut -c1-200 | say
