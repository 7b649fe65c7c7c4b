#!/usr/bin/env bash
# Fourth H200 run of the wave (issue 12): the U-Net at a batch that fills about half the GPU
# for PyTorch (bench/gpu-unet.sh: cvc, PyTorch eager, JAX; then cvc under a budget of 0.38x
# the smallest peer peak), and the long-sequence GRU with chunked back-propagation through
# time under a memory budget (bench/gpu-gru.sh --budget). One summary file in $OUT.
#   bench/gpu-wave4.sh [unet-batch] [gru-budget]
set -u
cd "$(dirname "$0")/.."
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
. bench/gpu-env.sh >/dev/null
export CVC_GPU_BIN=.gpu
S=${OUT:-/tmp}/summary.txt
say() { tee -a "$S"; }
( OUT=/tmp timeout 150 bash bench/gpu-gru.sh --batch 128 --length 4096 --hidden 32 --steps 10 --no-compile --peer-timeout 100 --budget "${2:-100MiB}" 2>&1 | tail -5 ) | say
grep -h -E "arena|chunk" /tmp/gru/plan_cvc_budget_*_b128_l4096_h32.txt 2>/dev/null | head -4 | say
( OUT=/tmp timeout 430 bash bench/gpu-unet.sh --batch "${1:-6144}" --steps 3 --no-train --no-compile --peer-timeout 150 --budget-fraction 0.38 2>&1 | tail -8 ) | say
grep -h -E "arena|recomputed" /tmp/unet/*.plan 2>/dev/null | head -6 | say
tail -3 /tmp/unet/peers.err 2>/dev/null | cut -c1-300 | say
