#!/usr/bin/env bash
# One H200 run for the wave of issues 11-13 (builds nothing; binaries in .gpu/):
#   A. GPU correctness (in parallel): the gpu test binary's cases for the new kernels
#      (3-D volume layers, 64-bit indexing, attention, batched matmul, every fixture incl. the
#      recurrent and U-Net/MRI twins), and short `cvc train --device cuda` runs of the new
#      examples (rf_gru, mri_volume, polsar_unet) with their liveness reports;
#   B. bench/gpu-bigbatch.sh (the seed network at the batch that fills 120 GiB), alone;
#   C. bench/gpu-unet.sh (U-Net vs PyTorch eager / torch.compile / JAX), alone.
# Usage: bench/gpu-wave.sh [A-seconds] [B-seconds] [C-seconds]; short summaries last.
set -u
cd "$(dirname "$0")/.."
TA=${1:-200} TB=${2:-180} TC=${3:-110}
O=${OUT:-bench/out}/wave
mkdir -p "$O"
# The test binary finds the fixtures where it was built (/work/main/tests).
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
. bench/gpu-env.sh
export CVC_REQUIRE_GPU=1
export CVC_GPU_BIN=.gpu OUT=${OUT:-bench/out}
t0=$SECONDS
echo "== A: GPU tests and example trainings ($TA s)"
( timeout "$TA" .gpu/gpu --test-threads 1 volume_layers_match attention_kernels_match batched_matmul_forms \
    every_fixture_matches sixty_four_bit 2>&1 | grep -E "^test |panicked|mismatch|error|result" | tail -60 > "$O/gputests.txt" ) &
TP=$!
for ex in rf_gru mri_volume polsar_unet; do
  timeout $(( TA / 3 )) .gpu/cvc train examples/$ex.cvnn --device cuda --epochs 2 --overwrite --out "/tmp/runs/$ex" \
    > "/tmp/train_$ex.txt" 2>&1
  echo "rc=$?" >> "/tmp/train_$ex.txt"
  grep -v "^\s*$" "/tmp/train_$ex.txt" | tail -25 > "$O/train_$ex.txt"
  cp "/tmp/runs/$ex/metrics.jsonl" "$O/metrics_$ex.jsonl" 2>/dev/null
done
wait $TP
echo "A took $(( SECONDS - t0 )) s"
t1=$SECONDS
echo "== B: big batch ($TB s)"
timeout "$TB" bash bench/gpu-bigbatch.sh --epochs 2 > "$O/bigbatch.txt" 2>&1; echo "rc=$?" >> "$O/bigbatch.txt"
echo "B took $(( SECONDS - t1 )) s"
t2=$SECONDS
echo "== C: U-Net ($TC s)"
timeout "$TC" bash bench/gpu-unet.sh --batch 32 --no-train --peer-timeout 45 > "$O/unet.txt" 2>&1; echo "rc=$?" >> "$O/unet.txt"
echo "C took $(( SECONDS - t2 )) s"
for f in gputests.txt train_rf_gru.txt train_mri_volume.txt train_polsar_unet.txt bigbatch.txt unet.txt; do
  echo "=== $f"; tail -14 "$O/$f"
done
