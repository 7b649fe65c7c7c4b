#!/usr/bin/env bash
# Device call of 2026-12-06 (second session): the `wgmma` row operand from registers
# (`wga=regs`) against shared memory in tf32; fp32 on split TF32 operands (`fp32=3xtf32`,
# compiler/src/back/cuda/gemm.rs) under the stage and tile choices that leave two blocks per SM
# where the split's twin planes double a stage, profiled kernel by kernel (CVC_TC_PROFILE_ALL);
# the GPU per-kernel checks of `wga=regs` (tf32, and fp32 split) and of the split on `mma.sync`; then Nsight Compute on one tf32 step's
# GEMM kernels of the seed network: how busy the tensor pipe and shared memory are (is the
# `wgmma` GEMM bound by shared-memory bandwidth?).
# CVC_W35_PARTS picks from "bench check ncu" (default all). Builds nothing (.gpu/gpu); a table last.
. "$(dirname "$0")/gpu-prologue.sh"
GPU=${CVC_GPU_TEST_BIN:-.gpu/gpu}
RUNS=${CVC_W35_RUNS:-seed_cnn 1024 tf32 default|seed_cnn 1024 tf32 wga=regs|vit_sar 128 tf32 default|vit_sar 128 tf32 wga=regs|seed_cnn 1024 fp32 default|seed_cnn 1024 fp32 fp32=3xtf32|seed_cnn 1024 fp32 fp32=3xtf32,wga=regs|seed_cnn 1024 fp32 fp32=3xtf32,tcstages=2|vit_sar 128 fp32 fp32=3xtf32,wga=regs}
for part in ${CVC_W35_PARTS:-bench check ncu}; do
  case $part in
    bench)
      OUT=$W CVC_GPU_TEST_BIN=$GPU CVC_TC_PROFILE_ALL=1 CVC_TC_RUNS="$RUNS" bash bench/gpu-tc.sh bench >/dev/null
      grep -v '^{' "$W/summary.txt" | grep -v "^tests" | grep -E "profile|gemm |attn |  [0-9.]+ ms  k|^seed|^vit|^file" | head -120 >>"$S"
      grep -h '^{' "$W/tc.jsonl" >>"$S"
      ;;
    check)
      OUT=$W CVC_GPU_TEST_BIN=$GPU CVC_TC_TESTS="${CVC_W35_CHECKS:-wga=regs:tf32:0 fp32=3xtf32,wga=regs:fp32:0 fp32=3xtf32,mma=sync:fp32:0}" bash bench/gpu-tc.sh tests >/dev/null
      grep -h -E "^tests" "$W/summary.txt" | tee -a "$S"
      grep -h -E "mismatches$" "$W"/tests-*.log | tail -20 | tee -a "$S"
      ;;
    ncu)
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
      echo "ncu: $NCU" | tee -a "$S"
      CVC_KERNELS=default CVC_BENCH_FILE=examples/seed_cnn.cvnn CVC_BENCH_BATCH=1024 CVC_BENCH_PRECISIONS=tf32 \
        CVC_BENCH_PROFILE= CVC_BENCH_STEPS=1 timeout 200 "$NCU" --clock-control none -k "regex:gemm" --launch-count 11 \
        --metrics gpu__time_duration.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed_op_ldgsts.sum,l1tex__throughput.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed \
        "$GPU" bench_seed_cnn --ignored --nocapture --test-threads=1 >"$W/ncu.txt" 2>&1
      echo "ncu: exit $?" | tee -a "$S"
      grep -E "^  k[0-9]+_gemm|gpu__time|gmma|wavefronts|bank_conflicts|ldgsts|l1tex__throughput|warps_active|issue_active|dram__" "$W/ncu.txt" \
        | sed 's/  */ /g' | cut -c1-150 | head -160 >>"$S"
      ;;
  esac
done
rm -f "$W/b.out"
tar czf "$O/logs.tgz" -C "$W" . 2>/dev/null
grep -E "^tests|mismatch|panicked|ncu|^seed|^vit|^file|gemm  |attn  " "$S" | tail -40
