#!/usr/bin/env bash
# Device call of 2026-12-07 (sixth session), issue 13: reduction epilogues (an average pool's
# `sum × ¼` written by its window-sum kernel; passes/fusion.rs `merge_epilogues`) and the first
# layer's batchnorm sums inside its direct convolution (`convstats=fuse`, back/cuda/conv.rs).
#   bench: the seed network at batch 1024, the build before these changes (.gpu-old, main at
#          17f291f) and this one (.gpu) alternating run by run, this one also under
#          `convstats=apart` (the sums as a kernel of their own) and at bf16 under `ewbatch=1`
#          (every small elementwise kernel its own launch, as before), profiled;
#   jax:   the JAX seed network at its default precision and in fp32, same call;
#   check: every example's kernels on the GPU against the f64 interpreter (this build);
#   vit:   the ViT at bf16 (default and `ewbatch=1`) and fp32, then the JAX ViT in fp32
#          (CVC_W38_JAX_VIT=0 skips it).
# CVC_W38_PARTS picks from "bench jax check vit" (default all four, in that order);
# CVC_W38_RUNS, CVC_W38_VIT_RUNS: '|'-separated `BUILD FILE BATCH PRECISION SPEC` items (BUILD:
# old or new);
# CVC_W38_CHECKS: `SPEC:PRECISIONS:FIXTURES` items for the check.
# Builds nothing (.gpu/gpu, .gpu-old/gpu); a table last.
. "$(dirname "$0")/gpu-prologue.sh"
RUNS=${CVC_W38_RUNS:-"old seed_cnn 1024 bf16 default|new seed_cnn 1024 bf16 default|new seed_cnn 1024 bf16 convstats=apart|new seed_cnn 1024 bf16 ewbatch=1|old seed_cnn 1024 tf32 default|new seed_cnn 1024 tf32 default|new seed_cnn 1024 tf32 convstats=apart|old seed_cnn 1024 fp32 default|new seed_cnn 1024 fp32 default|old seed_cnn 1024 bf16 default|new seed_cnn 1024 bf16 default"}
VIT_RUNS=${CVC_W38_VIT_RUNS:-"new vit_sar 128 bf16 default|new vit_sar 128 bf16 ewbatch=1|new vit_sar 128 fp32 default"}
# The runs of '|'-separated items $1, profiled, then their table.
bench_runs() {
  : >"$W/tc.jsonl"
  IFS='|' read -ra RS <<<"$1"
  for r in "${RS[@]}"; do
    set -- $r
    bin=.gpu/gpu
    [ "$1" = old ] && bin=.gpu-old/gpu
    OUT=$W CVC_GPU_TEST_BIN=$bin CVC_TC_TAG="-$1" CVC_TC_APPEND=1 CVC_TC_PROFILE_ALL=1 \
      CVC_TC_RUNS="$2 $3 $4 $5" bash bench/gpu-tc.sh bench >/dev/null
  done
  grep -h '^{' "$W/tc.jsonl" | tee -a "$S" | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
print("%-10s %-6s %-26s %10s %10s %10s" % ("file", "mode", "choice / build", "step ms", "min ms", "peak MiB"))
for r in rows:
    print("%-10s %-6s %-26s %10.3f %10.3f %10s" % (r["file"], r["mode"], r["choice"], r["step_ms"], r["step_ms_min"],
          r.get("peak_mib", r.get("measured_peak_mib", "-"))))
' | tee -a "$S"
}
for part in ${CVC_W38_PARTS:-bench jax check vit}; do
  case $part in
    bench)
      bench_runs "$RUNS"
      grep -v '^{' "$W/summary.txt" | grep -E "profile|  [0-9.]+ ms  k" | head -200 >>"$S"
      ;;
    vit)
      bench_runs "$VIT_RUNS"
      # The JAX ViT in fp32 (issue 11's peer) when CVC_W38_JAX_VIT=1 (default).
      if [ "${CVC_W38_JAX_VIT:-1}" = 1 ]; then
        PYTHONUNBUFFERED=1 timeout 200 python3 bench/vit/jax_vit.py --tokens 256 --batch 128 --precision fp32 --steps 10 \
          2>>"$W/jax.err" | tail -1 | tee -a "$S"
      fi
      ;;
    jax)
      for flag in "" --fp32; do
        PYTHONUNBUFFERED=1 timeout 120 python3 bench/jax_seed_cvnn.py $flag 2>>"$W/jax.err" | tail -1 | tee -a "$S"
      done
      ;;
    check)
      OUT=$W CVC_GPU_TEST_BIN=.gpu/gpu CVC_TC_TESTS="${CVC_W38_CHECKS:-default:bf16,tf32:0}" bash bench/gpu-tc.sh tests >/dev/null
      grep -h -E "^tests" "$W/summary.txt" | tee -a "$S"
      grep -h -E "mismatches$|panicked|FAIL" "$W"/tests-*.log | tail -20 | tee -a "$S"
      ;;
  esac
done
rm -f "$W/b.out"
tar czf "$O/logs.tgz" -C "$W" . 2>/dev/null
grep -E "^tests|mismatch|panicked|^seed|^file|jax|step|^vit" "$S" | grep -v "^{" | tail -45
