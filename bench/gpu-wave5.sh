#!/usr/bin/env bash
# Fifth H200 run of the wave (issue 12): the U-Net run under a budget that bench/gpu-wave4.sh's
# time limit cut off (batch 6144, 0.38x PyTorch's measured peak there), then cvc, PyTorch eager
# and JAX side by side at batch 1024 (where JAX fits). One summary file in $OUT.
set -u
cd "$(dirname "$0")/.."
. bench/gpu-env.sh >/dev/null
export CVC_GPU_BIN=.gpu
S=${OUT:-/tmp}/summary.txt
say() { tee -a "$S"; }
( OUT=/tmp/b6144 timeout 260 bash bench/gpu-unet.sh --batch 6144 --steps 3 --no-train --no-peers --no-cvc-plain --budget "${1:-25227MiB}" 2>&1 | tail -4 ) | say
( OUT=/tmp/b1024 timeout 240 bash bench/gpu-unet.sh --batch 1024 --steps 5 --no-train --no-compile --peer-timeout 90 --budget-fraction 0.38 2>&1 | tail -7 ) | say
