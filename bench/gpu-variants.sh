#!/usr/bin/env bash
# Kernel choices of the CUDA back end side by side on one GPU (fp32 unless noted):
#   default   direct kernels (compiler/src/back/cuda/conv.rs) for stride-1 convolutions with
#             at most 32 output channels per group, implicit GEMM for the rest; split-K to
#             fill 1056 blocks
#   gemm      CVC_CUDA_CONV=gemm: implicit GEMM for every convolution
#   direct64  CVC_CUDA_CONV=direct64: direct kernels for every stride-1 convolution
#   fill528, fill264   CVC_CUDA_FILL=528 / 264: split-K fills fewer blocks
#   bk32      CVC_CUDA_BK=32: 32-deep K tiles in the fp32 implicit GEMM (tiles up to 64 wide)
# Runs every GPU test with the default and the forward/backward test with direct64, then the
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
echo "== GPU forward/backward test, direct64 =="
CVC_CUDA_CONV=direct64 CVC_REQUIRE_GPU=1 "$BIN/gpu" every_example_matches_the_interpreter_forward_and_backward \
  --test-threads=1 >>"$LOG/tests.log" 2>&1 && echo "forward/backward test: pass" \
  || { tail -30 "$LOG/tests.log"; echo "forward/backward test: FAIL"; }
for v in default gemm direct64 fill528 fill264 bk32; do
  case $v in
    default) envs="" ;; gemm) envs="CVC_CUDA_CONV=gemm" ;; direct64) envs="CVC_CUDA_CONV=direct64" ;;
    fill528) envs="CVC_CUDA_FILL=528" ;; fill264) envs="CVC_CUDA_FILL=264" ;; bk32) envs="CVC_CUDA_BK=32" ;;
  esac
  echo "== benchmark, $v ($envs) =="
  env $envs CVC_REQUIRE_GPU=1 "$BIN/gpu" --ignored bench_seed_cnn --nocapture --test-threads=1 \
    2>"$LOG/bench-$v.err" | grep '"mode"' | sed "s/^.*{/{\"variant\": \"$v\", /" | tee -a "$LOG/variants.jsonl"
  grep -A20 '^profile' "$LOG/bench-$v.err" | head -20
done
echo "== cuBLAS cgemm on the step's matmul shapes (cvc's: k85, k101, k102 in bench-default.err) =="
python3 bench/cublas_matmul.py 2>&1 | tail -5
grep -E 'k(85|101|102)_gemm' "$LOG/bench-default.err" | tail -3
python3 - "$LOG/variants.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("\n%-9s %-9s %10s %10s" % ("variant", "numerics", "step ms", "peak MiB"))
for r in rows:
    print("%-9s %-9s %10.2f %10.0f" % (r["variant"], r["mode"][4:], r["step_ms"], r["peak_mib"]))
PY
