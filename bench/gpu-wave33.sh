#!/usr/bin/env bash
# Device calls of 2026-12-05, third session: the wgmma GEMM's tile fetch computes what depends
# on an element's shared index once per tile and places elements at the thread's offset plus a
# constant (compiler/src/back/cuda/gemm.rs `emit_wgmma`), against the build before it
# (.gpu-old/, main at 846ea03). The calls made: bench/RESULTS.md.
#   CVC_WAVE_PARTS=bench: $CVC_WAVE_BASE on the old and new builds, then $CVC_WAVE_VARIANTS on
#     the new one (bench/gpu-tc.sh bench: medians of 10 data-resident steps; the defaults
#     profiled unless CVC_WAVE_PROFILE=0);
#   CVC_WAVE_PARTS=check: every example trained one step, kernel by kernel against the f64
#     interpreter, per `SPEC:PRECISIONS:FIXTURES` item of $CVC_WAVE_CHECKS (bench/gpu-tc.sh tests);
#   CVC_WAVE_PARTS=volume: the GPU test that the 300 s limit cut last time, alone;
#   CVC_WAVE_PARTS=jax: the JAX seed network at batch 1024, default precision and fp32
#     (bench/jax_seed_cvnn.py); CVC_WAVE_JAX_VIT=1 adds the JAX ViT (bench/vit/jax_vit.py).
# Builds nothing; summary in $OUT, a table last.
. "$(dirname "$0")/gpu-prologue.sh"
NEW=${CVC_NEW_BIN:-.gpu/gpu}
OLD=${CVC_OLD_BIN:-.gpu-old/gpu}
BASE=${CVC_WAVE_BASE:-seed_cnn 1024 tf32 default|vit_sar 128 tf32 default}
VARIANTS=${CVC_WAVE_VARIANTS:-seed_cnn 1024 tf32 tctaps=table|vit_sar 128 tf32 tctaps=table}
for part in ${CVC_WAVE_PARTS:-bench}; do
  case $part in
    bench)
      [ "${CVC_WAVE_OLD:-1}" = 0 ] || OUT=$W CVC_GPU_TEST_BIN=$OLD CVC_TC_APPEND=1 CVC_TC_TAG=-old CVC_TC_PROFILE=0 \
        CVC_TC_RUNS="$BASE" bash bench/gpu-tc.sh bench >/dev/null
      OUT=$W CVC_GPU_TEST_BIN=$NEW CVC_TC_APPEND=1 CVC_TC_TAG=-new CVC_TC_PROFILE=${CVC_WAVE_PROFILE:-1} \
        CVC_TC_RUNS="$BASE|$VARIANTS" bash bench/gpu-tc.sh bench >/dev/null
      grep -v '^{' "$W/summary.txt" | grep -v "^tests" | tail -80 >>"$S"
      grep -h '^{' "$W/tc.jsonl" >>"$S"
      ;;
    check)
      OUT=$W CVC_GPU_TEST_BIN=$NEW CVC_TC_TESTS="${CVC_WAVE_CHECKS:-tctaps=table:tf32,bf16:0}" bash bench/gpu-tc.sh tests >/dev/null
      grep -h -E "^tests" "$W/summary.txt" | tee -a "$S"
      grep -h -E "mismatches$" "$W"/tests-*.log | tail -40 | tee -a "$S"
      ;;
    volume)
      CVC_REQUIRE_GPU=1 timeout ${CVC_VOLUME_LIMIT:-280} "$NEW" volume_layers_match_the_interpreter --test-threads=1 \
        >"$W/volume.log" 2>&1
      echo "volume_layers_match_the_interpreter: exit $? ($(grep -h 'test result' "$W/volume.log" | cut -c1-60))" | tee -a "$S"
      ;;
    jax)
      if [ "${CVC_WAVE_JAX_VIT:-0}" = 1 ]; then
        for prec in tf32 fp32; do
          PYTHONUNBUFFERED=1 timeout 200 python3 bench/vit/jax_vit.py --tokens 256 --batch 128 --precision $prec --steps 10 \
            2>>"$W/jax.err" | tail -1 | tee -a "$S"
        done
      fi
      for flag in "" --fp32; do
        PYTHONUNBUFFERED=1 timeout 120 python3 bench/jax_seed_cvnn.py $flag 2>>"$W/jax.err" | tail -1 | tee -a "$S"
      done
      ;;
  esac
done
rm -f "$W/b.out"
tar czf "$O/logs.tgz" -C "$W" . 2>/dev/null
grep -E "^== |exit|test result|mismatch|panicked|step ms|cvc_|ms  k|jax|gemm  " "$S" | grep -v '^{' | tail -70
