#!/usr/bin/env bash
# H200 calls of 2026-12-05: Hopper's warpgroup products for the TF32 GEMM (`mma=wgmma`, now
# the default; compiler/src/back/cuda/gemm.rs `emit_wgmma`, a module for sm_90a; `mma=sync` the
# per-warp form), and the attention that reads its heads in place (e6fa80b), against the build
# before it (.gpu-old/, 09f6926). The calls made: bench/RESULTS.md.
#   CVC_WAVE_PARTS=wgmma: every example (and fixture) trained one step in TF32 with `mma=wgmma`,
#     kernel by kernel against the f64 interpreter (bench/gpu-tc.sh tests);
#   CVC_WAVE_PARTS=bench: $CVC_WAVE_BASE on the old and new builds, then $CVC_WAVE_VARIANTS on
#     the new one (bench/gpu-tc.sh bench: medians of 10 data-resident steps; the defaults
#     profiled unless CVC_WAVE_PROFILE=0);
#   CVC_WAVE_PARTS=tests: every GPU test on the new build (bench/gpu-suite.sh);
#   CVC_WAVE_PARTS=jax: the JAX ViT at 256 tokens, batch 128, tf32 and fp32 (bench/vit/jax_vit.py)
#     and the JAX seed network at batch 1024 (bench/jax_seed_cvnn.py), default and fp32.
# Builds nothing; summary in $OUT, a table last.
. "$(dirname "$0")/gpu-prologue.sh"
NEW=${CVC_NEW_BIN:-.gpu/gpu}
OLD=${CVC_OLD_BIN:-.gpu-old/gpu}
BASE=${CVC_WAVE_BASE:-vit_sar 128 tf32 default}
VARIANTS=${CVC_WAVE_VARIANTS:-seed_cnn 1024 tf32 default|vit_sar 128 tf32 mma=sync|seed_cnn 1024 tf32 mma=sync|vit_sar 128 fp32 default|vit_sar 128 bf16 default}
for part in ${CVC_WAVE_PARTS:-wgmma bench}; do
  case $part in
    wgmma)
      OUT=$W CVC_GPU_TEST_BIN=$NEW CVC_TC_TESTS="${CVC_WAVE_WGMMA_TESTS:-mma=wgmma:tf32:1}" bash bench/gpu-tc.sh tests >/dev/null
      grep -h -E "^tests" "$W/summary.txt" | tee -a "$S"
      grep -h -E "mismatches$" "$W"/tests-*.log | tail -40 | tee -a "$S"
      ;;
    bench)
      [ "${CVC_WAVE_OLD:-1}" = 0 ] || OUT=$W CVC_GPU_TEST_BIN=$OLD CVC_TC_APPEND=1 CVC_TC_TAG=-old CVC_TC_PROFILE=0 \
        CVC_TC_RUNS="$BASE" bash bench/gpu-tc.sh bench >/dev/null
      OUT=$W CVC_GPU_TEST_BIN=$NEW CVC_TC_APPEND=1 CVC_TC_TAG=-new CVC_TC_PROFILE=${CVC_WAVE_PROFILE:-1} \
        CVC_TC_RUNS="$BASE|$VARIANTS" bash bench/gpu-tc.sh bench >/dev/null
      grep -v '^{' "$W/summary.txt" | grep -v "^tests" | tail -80 >>"$S"
      grep -h '^{' "$W/tc.jsonl" >>"$S"
      ;;
    tests)
      CVC_SUITE_LIMIT=${CVC_SUITE_LIMIT:-330}
      . bench/gpu-suite.sh
      ;;
    jax)
      for prec in tf32 fp32; do
        PYTHONUNBUFFERED=1 timeout 200 python3 bench/vit/jax_vit.py --tokens 256 --batch 128 --precision $prec --steps 10 \
          2>>"$W/jax.err" | tail -1 | tee -a "$S"
      done
      for flag in "" --fp32; do
        PYTHONUNBUFFERED=1 timeout 120 python3 bench/jax_seed_cvnn.py $flag 2>>"$W/jax.err" | tail -1 | tee -a "$S"
      done
      ;;
  esac
done
rm -f "$W/b.out"
tar czf "$O/logs.tgz" -C "$W" . 2>/dev/null
grep -E "^== |exit|test result|mismatch|panicked|step ms|cvc_|ms  k|jax" "$S" | grep -v '^{' | tail -70
