#!/usr/bin/env bash
# Device call of 2026-12-06 (third session): stride-1 convolutions and their input gradients
# on halo tiles (`tcconv=halo`, compiler/src/back/cuda/halo.rs) against the implicit GEMM in
# tf32: the GPU per-kernel check of every example and fixture under `tcconv=halo`, then the
# seed network at batch 1024 side by side (default, halo, halo with 1 block per SM (no spills)
# and with 2 stages), profiled kernel by kernel.
# CVC_W36_PARTS picks from "check bench ncu jax" (default "check bench"). Builds nothing (.gpu/gpu); a table last.
. "$(dirname "$0")/gpu-prologue.sh"
GPU=${CVC_GPU_TEST_BIN:-.gpu/gpu}
RUNS=${CVC_W36_RUNS:-seed_cnn 1024 tf32 default|seed_cnn 1024 tf32 tcconv=gemm|seed_cnn 1024 tf32 tcconv=halo|seed_cnn 1024 tf32 default|seed_cnn 1024 tf32 tcconv=gemm|polsar_unet 1024 tf32 default|polsar_unet 1024 tf32 tcconv=gemm|complex_resnet 256 tf32 default|complex_resnet 256 tf32 tcconv=gemm}
for part in ${CVC_W36_PARTS:-check bench}; do
  case $part in
    bench)
      OUT=$W CVC_GPU_TEST_BIN=$GPU CVC_TC_PROFILE_ALL=1 CVC_TC_RUNS="$RUNS" bash bench/gpu-tc.sh bench >/dev/null
      grep -v '^{' "$W/summary.txt" | grep -v "^tests" | grep -E "profile|gemm |attn |  [0-9.]+ ms  k|^seed|^vit|^file" | head -120 >>"$S"
      grep -h '^{' "$W/tc.jsonl" >>"$S"
      ;;
    ncu)
      # Nsight Compute on the halo kernels of one tf32 step: the stall reasons, how busy the
      # tensor pipe, shared memory and L1 are (why the forward layers gain less than the
      # input gradients).
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
      CVC_KERNELS=${CVC_W36_NCU_KERNELS:-tcconv=halo} CVC_BENCH_FILE=examples/seed_cnn.cvnn CVC_BENCH_BATCH=1024 CVC_BENCH_PRECISIONS=tf32 \
        CVC_BENCH_PROFILE= CVC_BENCH_STEPS=1 timeout 300 "$NCU" --clock-control none -k "regex:k(31|62|113|146)_gemm" --launch-count 4 \
        --section WarpStateStats --section SchedulerStats --section Occupancy \
        --metrics gpu__time_duration.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed_op_ldgsts.sum,l1tex__t_sector_hit_rate.pct,lts__t_sector_hit_rate.pct,l1tex__throughput.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum \
        "$GPU" bench_seed_cnn --ignored --nocapture --test-threads=1 >"$W/ncu.txt" 2>&1
      echo "ncu: exit $?" | tee -a "$S"
      grep -E "^  k[0-9]+_gemm|gpu__time|gmma|wavefronts|bank_conflicts|ldgsts|hit_rate|l1tex__throughput|dram__|inst_executed|Stall|stall|Warp Cycles|Active Warps|Eligible|Issued Warp|No Eligible|Occupancy|Registers|Block Limit" "$W/ncu.txt" \
        | sed 's/  */ /g' | cut -c1-150 | head -200 >>"$S"
      ;;
    jax)
      # The JAX seed network at batch 1024, default precision (TF32) and fp32, same call.
      for flag in "" --fp32; do
        PYTHONUNBUFFERED=1 timeout 120 python3 bench/jax_seed_cvnn.py $flag 2>>"$W/jax.err" | tail -1 | tee -a "$S"
      done
      ;;
    check)
      OUT=$W CVC_GPU_TEST_BIN=$GPU CVC_TC_TESTS="${CVC_W36_CHECKS:-default:tf32:1 tcconv=halo:tf32:1}" bash bench/gpu-tc.sh tests >/dev/null
      grep -h -E "^tests" "$W/summary.txt" | tee -a "$S"
      grep -h -E "mismatches$|panicked|FAIL" "$W"/tests-*.log | tail -20 | tee -a "$S"
      ;;
  esac
done
rm -f "$W/b.out"
tar czf "$O/logs.tgz" -C "$W" . 2>/dev/null
grep -E "^tests|mismatch|panicked|^seed|^vit|^polsar|^complex|^file|gemm  |attn  |jax|step" "$S" | grep -v "^{" | tail -40
