#!/usr/bin/env bash
# Second H200 run of the wave: the GPU tests cut off in bench/gpu-wave.sh (3-D volume layers,
# 64-bit indexing), the big-batch seed run (memory shown before it, then 90% of the offered
# batch if the offered one fails), the U-Net against PyTorch eager and JAX (torch.compile timed
# out in the first run). Each step appends to one summary file in $OUT.
set -u
cd "$(dirname "$0")/.."
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
. bench/gpu-env.sh >/dev/null
export CVC_REQUIRE_GPU=1 CVC_GPU_BIN=.gpu
S=${OUT:-/tmp}/summary.txt
say() { tee -a "$S"; }
timeout "${1:-170}" .gpu/gpu --test-threads 1 volume_layers sixty_four_bit > /tmp/g.txt 2>&1
echo "gpu tests rc=$?" | say
grep -E "\.\.\. ok$|^ok$|FAILED|panicked|test result|^test " /tmp/g.txt | cut -c1-200 | tail -12 | say
nvidia-smi --query-gpu=memory.used,memory.free --format=csv | say
OUT=/tmp timeout "${2:-110}" bash bench/gpu-bigbatch.sh --epochs 2 > /tmp/bb.txt 2>&1
grep -E "largest batch|error|exit|^\|" /tmp/bb.txt | cut -c1-200 | say
if grep -q "no metrics for batch" /tmp/bb.txt; then
  echo "-- retry with a 110 GiB budget" | say
  OUT=/tmp timeout "${2:-110}" bash bench/gpu-bigbatch.sh --epochs 2 --budget 110GiB > /tmp/bb2.txt 2>&1
  grep -E "largest batch|error|exit|^\|" /tmp/bb2.txt | cut -c1-200 | say
fi
nvidia-smi --query-gpu=memory.used,memory.free --format=csv | say
( OUT=/tmp timeout "${3:-110}" bash bench/gpu-unet.sh --batch 32 --no-train --no-compile --peer-timeout 40 2>&1 | tail -9 ) | say
