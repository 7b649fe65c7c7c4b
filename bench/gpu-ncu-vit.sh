#!/usr/bin/env bash
# Nsight Compute on one fp32 ViT step (256 tokens, batch 128): the largest GEMM of a layer
# (the 4th GEMM launch, the first layer's MLP linear(768)) with 4 and 3 real products per
# complex term (`cmul=4m|3m`), the first attention launch (layer 1's forward with its
# log-sum-exp, `attn_fwd_lse`) and the 13th and 14th (the last layer's dq and dk‖dv). Then the
# profile of the step with the kernels' registers. CVC_NCU_PRECISION=tf32 (or bf16) profiles
# that precision instead (the tensor-core GEMM and attention kernels; no 3M run there).
# Builds nothing; summary in $OUT.
. "$(dirname "$0")/gpu-prologue.sh"
command -v ncu >/dev/null || { echo "no ncu" | tee -a "$S"; exit 0; }
P=${CVC_NCU_PRECISION:-fp32}
sec="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section InstructionStats"
nc() { # tag spec kernel-regex skip count
  CVC_KERNELS=$2 CVC_BENCH_FILE=examples/vit_sar.cvnn CVC_BENCH_BATCH=128 CVC_BENCH_PRECISIONS=$P CVC_BENCH_STEPS=1 \
    timeout 150 ncu --clock-control none --kernel-name "regex:$3" --launch-skip $4 --launch-count $5 $sec \
    .gpu/gpu --ignored bench_seed_cnn --test-threads=1 >"$W/ncu-$1.txt" 2>&1
  echo "== ncu $1 $P (kernels $2, $3 skip $4 count $5): exit $?" | tee -a "$S"
  grep -E '^  k[0-9]+_|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Issue Slots Busy|Executed Ipc Active|L1/TEX Hit|Shared Memory|Bank' "$W/ncu-$1.txt" | tee -a "$S" >/dev/null
}
nc gemm-4m default '_gemm$' 3 1
[ "$P" = fp32 ] && nc gemm-3m cmul=3m '_gemm$' 3 1
nc attn-fwd default '_attn$' 0 1
nc attn-bwd default '_attn$' 12 2
cp "$W"/ncu-*.txt "$O/" 2>/dev/null
tar czf "$O/logs.tgz" -C "$W" . 2>/dev/null
grep -E '^== |^  k[0-9]+_|Duration|Registers Per|Achieved Occupancy|Executed Ipc Active|Compute \(SM\) Throughput' "$S"
