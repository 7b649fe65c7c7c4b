#!/usr/bin/env bash
# Kernel choices of the CUDA back end side by side on one GPU (fp32 unless noted):
#   default   direct kernels (compiler/src/back/cuda/conv.rs) for stride-1 convolutions with
#             at most 32 output channels per group, implicit GEMM for the rest; split-K to
#             fill 1056 blocks
#   gemm      conv=gemm: implicit GEMM for every convolution
#   direct64  conv=direct64: direct kernels for every stride-1 convolution
#   fill528, fill264   fill=528 / 264: split-K fills fewer blocks
#   bk32      bk=32: 32-deep K tiles in the fp32 implicit GEMM (tiles up to 64 wide)
#   wgemm     wgrad=gemm: implicit GEMM for the weight gradients (no direct kernel,
#             compiler/src/back/cuda/wgrad.rs)
#   ot4, pf, ot4pf   wgrad=ot4 / pf / ot4pf: the direct weight-gradient kernel with four
#             output channels per thread and/or the next pixel tile prefetched into registers
#   ck6, ck9  ck=6 / 9: input channels per shared-memory chunk of the direct
#             convolution kernel (default 32 / taps = 3 for 3×3 kernels)
# Each variant is a kernel spec (compiler/src/target.rs, KernelConfig::parse) that the GPU test
# binary reads from CVC_KERNELS; `cvc emit --cuda --kernels SPEC` prints a variant's source.
# Usage: bench/gpu-variants.sh [VARIANT...]   (default: default wgemm ot4 pf ot4pf)
#   with CVC_NCU=1 also Nsight Compute on the largest kernels of the default variant.
# Runs every GPU test with the default and the forward/backward test with ot4pf, then the
# seed_cnn benchmark (batch 1024) with its per-kernel profile for each. Prebuilt binaries as
# for bench/gpu.sh; prints a table last.
set -u
cd "$(dirname "$0")/.."
BIN=${CVC_GPU_BIN:-.gpu}
LOG=${OUT:-bench/out}
mkdir -p "$LOG"
. bench/gpu-env.sh
: >"$LOG/variants.jsonl"
echo "== GPU tests, default kernels =="
CVC_REQUIRE_GPU=1 "$BIN/gpu" --test-threads=1 >"$LOG/tests.log" 2>&1 && echo "all GPU tests: pass" \
  || { tail -40 "$LOG/tests.log"; echo "all GPU tests: FAIL"; }
echo "== GPU forward/backward test, ot4pf =="
CVC_KERNELS=wgrad=ot4pf CVC_REQUIRE_GPU=1 "$BIN/gpu" every_example_matches_the_interpreter_forward_and_backward \
  --test-threads=1 >>"$LOG/tests.log" 2>&1 && echo "forward/backward test: pass" \
  || { tail -30 "$LOG/tests.log"; echo "forward/backward test: FAIL"; }
VARIANTS=${*:-default wgemm ot4 pf ot4pf}
for v in $VARIANTS; do
  case $v in
    default) spec="default" ;; gemm) spec="conv=gemm" ;; direct64) spec="conv=direct64" ;;
    fill528) spec="fill=528" ;; fill264) spec="fill=264" ;; bk32) spec="bk=32" ;;
    wgemm) spec="wgrad=gemm" ;; ot4|pf|ot4pf) spec="wgrad=$v" ;;
    ck6) spec="ck=6" ;; ck9) spec="ck=9" ;;
    *) echo "unknown variant $v" >&2; continue ;;
  esac
  echo "== benchmark, $v ($spec) =="
  CVC_KERNELS=$spec CVC_REQUIRE_GPU=1 "$BIN/gpu" --ignored bench_seed_cnn --nocapture --test-threads=1 \
    2>"$LOG/bench-$v.err" | grep '"mode"' | sed "s/^.*{/{\"variant\": \"$v\", /" | tee -a "$LOG/variants.jsonl"
  grep -A20 '^profile' "$LOG/bench-$v.err" | head -20
done
if [ "${CVC_NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
  echo "== Nsight Compute: the largest kernels of one fp32 step (default variant) =="
  CVC_BENCH_STEPS=1 timeout 240 ncu --clock-control none --kernel-name "regex:${CVC_NCU_KERNELS:-k(33|66|117|118|150|151)_gemm}" \
    --launch-count 6 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section InstructionStats \
    "$BIN/gpu" --ignored bench_seed_cnn --test-threads=1 >"$LOG/ncu.txt" 2>&1
  echo "ncu exit $?"; grep -E '^  k[0-9]+_|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Stall|Issue Slots Busy|Executed Ipc Active' "$LOG/ncu.txt" | head -80
fi
python3 - "$LOG/variants.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("\n%-9s %-9s %10s %10s" % ("variant", "numerics", "step ms", "peak MiB"))
for r in rows:
    print("%-9s %-9s %10.2f %10.0f" % (r["variant"], r["mode"][4:], r["step_ms"], r["peak_mib"]))
PY
