#!/usr/bin/env bash
# Where the seed network's contractions spend their time (issue 13): the step's per-kernel
# profile in tf32 and bf16 (bench/gpu-tc.sh bench), then Nsight Compute on one step's GEMM
# kernels: speed of light, occupancy, warp stall reasons, issue slots, and the tensor pipes'
# activity (`--clock-control none`, as the device notes ask). CVC_NCU_PRECISION picks the
# precision for ncu (default tf32), CVC_NCU_KERNELS the kernel regex (default gemm),
# CVC_NCU_RUNS the bench rows (bench/gpu-tc.sh's CVC_TC_RUNS form).
# Builds nothing (.gpu/gpu); ncu's reports in $OUT/ncu-*.txt, a table last.
. "$(dirname "$0")/gpu-prologue.sh"
GPU=${CVC_GPU_TEST_BIN:-.gpu/gpu}
PREC=${CVC_NCU_PRECISION:-tf32}
OUT=$W CVC_GPU_TEST_BIN=$GPU CVC_TC_RUNS="${CVC_NCU_RUNS:-seed_cnn 1024 tf32 default|seed_cnn 1024 bf16 default}" \
  bash bench/gpu-tc.sh bench >/dev/null
grep -v '^{' "$W/summary.txt" | tail -60 >>"$S"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU" | tee -a "$S"
run_ncu() {
  local tag=$1; shift
  CVC_KERNELS=${CVC_NCU_SPEC:-default} CVC_BENCH_FILE=examples/seed_cnn.cvnn CVC_BENCH_BATCH=1024 \
    CVC_BENCH_PRECISIONS=$PREC CVC_BENCH_PROFILE= CVC_BENCH_STEPS=1 timeout ${CVC_NCU_LIMIT:-150} \
    "$NCU" --clock-control none -k "regex:${CVC_NCU_KERNELS:-gemm}" --launch-count ${CVC_NCU_COUNT:-11} "$@" \
    "$GPU" bench_seed_cnn --ignored --nocapture --test-threads=1 >"$O/ncu-$tag.txt" 2>&1
  echo "ncu $tag: exit $?" | tee -a "$S"
}
run_ncu sections --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
  --section ComputeWorkloadAnalysis --section LaunchStats
run_ncu pipes --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__inst_executed_pipe_lsu.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,gpu__time_duration.sum
run_ncu stalls --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio"
grep -E "^  k[0-9]+_gemm|Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Achieved Occupancy|Theoretical Occupancy|Registers Per|No Eligible|Block Limit|Warp Cycles Per Issued" "$O/ncu-sections.txt" | head -150
grep -E "^  k[0-9]+_gemm|gmma|hmma|inst_executed|issue_active|bank_conflicts|gpu__time" "$O/ncu-pipes.txt" | head -100
rm -f "$W/b.out"
tar czf "$O/logs.tgz" -C "$W" . 2>/dev/null
grep -E "cvc_|ms  k|gemm  " "$S" | grep -v '^{' | tail -40
