#!/usr/bin/env bash
# The tensor-core GEMM's staging, tile and operand choices (issue 13;
# compiler/src/back/cuda/gemm.rs, KernelConfig `tc=plain|prefetch|async`, `tctile=64|128`,
# `tc16=native|tf32`) on one GPU, side by side:
# 1. correctness: every example trained one step in TF32 (and bf16 for the default), kernel
#    by kernel against the f64 interpreter, with the default choices (`tc=async`) and with
#    `tc=prefetch,tctile=128` (fixtures too: every contraction form); CVC_TC_TESTS overrides
#    the list (`SPEC:PRECISIONS:FIXTURES` items, e.g. "tc=plain:tf32:0");
# 2. speed: the seed network at batch 1024 (bench_seed_cnn) in tf32 and bf16 per variant, with
#    the profile of the default's contractions; CVC_TC_RUNS overrides the list ('|'-separated
#    `FILE BATCH PRECISION SPEC` items, e.g. "seed_cnn 1024 bf16 tc16=tf32").
# Builds nothing (.gpu/gpu; CVC_GPU_TEST_BIN names another test binary, e.g. an older build
# to compare side by side, CVC_TC_TAG labels its rows, CVC_TC_PROFILE=0 skips the profiles,
# CVC_BENCH_BUDGET plans under a memory budget). Usage: bench/gpu-tc.sh
# [tests|bench]... (default both).
# One summary file in $OUT; a table last.
set -u
cd "$(dirname "$0")/.."
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
. bench/gpu-env.sh >/dev/null
O=${OUT:-bench/out}
mkdir -p "$O"
S=$O/summary.txt
say() { tee -a "$S"; }
GPU=${CVC_GPU_TEST_BIN:-.gpu/gpu}
TAG=${CVC_TC_TAG:-}
for what in ${*:-tests bench}; do
  case $what in
    tests)
      for spec in ${CVC_TC_TESTS:-"default:tf32,bf16:0" "tc=prefetch,tctile=128:tf32:1"}; do
        spec=$(echo "$spec" | tr ':' ' ')
        set -- $spec
        tag=$(echo "$1" | tr '=,' '__')
        CVC_KERNELS=$1 CVC_PRECISION_LIST=$2 CVC_PRECISION_FIXTURES=${3:-0} CVC_REQUIRE_GPU=1 timeout 170 \
          "$GPU" reduced_precision_kernels_match_the_interpreter_within_their_format --test-threads=1 \
          >"$O/tests-$tag.log" 2>&1
        echo "tests, kernels $1, $2: exit $? ($(grep -h 'test result' "$O/tests-$tag.log" | cut -c1-60))" | say
        grep -h -i -E "fail|mismatch|panicked" "$O/tests-$tag.log" | head -8 | cut -c1-300 | say
      done
      ;;
    bench)
      [ -n "${CVC_TC_APPEND:-}" ] || : >"$O/tc.jsonl"
      runs=${CVC_TC_RUNS:-"seed_cnn 1024 tf32 default|seed_cnn 1024 tf32 tc=plain|seed_cnn 1024 tf32 tc=prefetch|seed_cnn 1024 tf32 tctile=128|seed_cnn 1024 tf32 tc=prefetch,tctile=128|seed_cnn 1024 bf16 default|seed_cnn 1024 bf16 tc=prefetch|seed_cnn 1024 bf16 tctile=128"}
      IFS='|' read -ra RUNS <<<"$runs"
      for run in "${RUNS[@]}"; do
        set -- $run
        tag=$(echo "$4" | tr '=,' '__')
        prof=none
        { [ "$4" = default ] || [ "${CVC_TC_PROFILE_ALL:-0}" = 1 ]; } && [ "${CVC_TC_PROFILE:-1}" = 1 ] && prof=$3
        CVC_KERNELS=$4 CVC_BENCH_FILE=examples/$1.cvnn CVC_BENCH_BATCH=$2 CVC_BENCH_PRECISIONS=$3 \
          CVC_BENCH_PROFILE=$([ $prof = none ] || echo $prof) CVC_BENCH_STEPS=10 timeout 120 \
          "$GPU" bench_seed_cnn --ignored --nocapture --test-threads=1 >"$O/b.out" 2>"$O/bench-$1-$3-$tag$TAG.err"
        grep -h -o '{"mode.*}' "$O/b.out" | sed "s/^{/{\"choice\": \"$4$TAG\", /" | tee -a "$O/tc.jsonl" | say
        [ $prof = none ] || grep -h -A20 "profile (kernels" "$O/bench-$1-$3-$tag$TAG.err" | say
      done
      python3 - "$O/tc.jsonl" <<'PY' | say
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = {}
for r in rows:
    if r["choice"] == "default":
        base[(r["file"], r["mode"])] = r["step_ms"]
print("\n%-10s %-10s %-22s %10s %10s %10s" % ("file", "mode", "choice", "step ms", "min ms", "x default"))
for r in rows:
    b = base.get((r["file"], r["mode"]))
    print("%-10s %-10s %-22s %10.3f %10.3f %10s" % (r["file"], r["mode"], r["choice"], r["step_ms"], r["step_ms_min"],
          "%.3f" % (r["step_ms"] / b) if b else "-"))
PY
      ;;
  esac
done
