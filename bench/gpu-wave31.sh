#!/usr/bin/env bash
# H200 calls of 2026-12-04 (sixth session): the tensor-core GEMM's asynchronous staging as a
# ring of K tiles in dynamic shared memory (`tcstages=N`, default 3: two tiles in flight while
# one is multiplied, one barrier per tile), and the direct FMA kernels for first layers too
# thin for tensor cores at the reduced precisions (conv.rs `too_shallow_for_tensor_cores`),
# against the build before (.gpu-old/, or $CVC_OLD_BIN).
#   CVC_WAVE_PARTS=tests: every GPU test on the new build (bench/gpu-suite.sh);
#   CVC_WAVE_PARTS=bench: ViT b128 and seed b1024, old and new builds in turn
#     ($CVC_WAVE_ROUNDS rounds, default 1), the new one also with $CVC_WAVE_VARIANTS
#     (default: the taps' table, `tctaps=table`, not yet run on a GPU; bench/RESULTS.md gives
#     the lists of the calls made); the new defaults profiled
#     (CVC_WAVE_PROFILE=0: not); CVC_WAVE_OLD=0 skips the old build, CVC_WAVE_BASE sets the
#     runs both builds make;
#   CVC_WAVE_PARTS=jax: the JAX ViT (bench/vit/jax_vit.py) at 256 tokens, batch 128, in tf32
#     (its default precision) and fp32, in the same call.
# Builds nothing; summary in $OUT, a table last.
. "$(dirname "$0")/gpu-prologue.sh"
NEW=${CVC_NEW_BIN:-.gpu/gpu}
OLD=${CVC_OLD_BIN:-.gpu-old/gpu}
BASE=${CVC_WAVE_BASE:-vit_sar 128 tf32 default|seed_cnn 1024 tf32 default|seed_cnn 1024 bf16 default}
for part in ${CVC_WAVE_PARTS:-tests bench}; do
  case $part in
    tests)
      CVC_SUITE_LIMIT=${CVC_SUITE_LIMIT:-420}
      . bench/gpu-suite.sh
      ;;
    bench)
      for round in ${CVC_WAVE_ROUNDS:-1}; do
        [ "${CVC_WAVE_OLD:-1}" = 0 ] || OUT=$W CVC_GPU_TEST_BIN=$OLD CVC_TC_APPEND=1 CVC_TC_TAG=-old$round CVC_TC_PROFILE=0 \
          CVC_TC_RUNS="$BASE" bash bench/gpu-tc.sh bench >/dev/null
        OUT=$W CVC_GPU_TEST_BIN=$NEW CVC_TC_APPEND=1 CVC_TC_TAG=-new$round CVC_TC_PROFILE=${CVC_WAVE_PROFILE:-1} \
          CVC_TC_RUNS="$BASE|${CVC_WAVE_VARIANTS:-seed_cnn 1024 tf32 tctaps=table|seed_cnn 1024 bf16 tctaps=table|vit_sar 128 tf32 tctaps=table}" \
          bash bench/gpu-tc.sh bench >/dev/null
      done
      grep -v '^{' "$W/summary.txt" | tail -60 >>"$S"
      grep -h '^{' "$W/tc.jsonl" >>"$S"
      ;;
    jax)
      for prec in tf32 fp32; do
        PYTHONUNBUFFERED=1 timeout 300 python3 bench/vit/jax_vit.py --tokens 256 --batch 128 --precision $prec --steps 10 \
          2>>"$W/jax.err" | tail -1 | tee -a "$S"
      done
      ;;
  esac
done
rm -f "$W/b.out"
tar czf "$O/logs.tgz" -C "$W" . 2>/dev/null
grep -E "^== |exit|test result|mismatch|panicked|step ms|cvc_|ms  k" "$S" | grep -v '^{' | tail -60
