#!/usr/bin/env bash
# H200 calls of 2026-12-04 (fifth session): the step as one CUDA graph (`launch=graph`,
# default), the gradients of sliced tensors joined into concatenations (a packed projection's
# q, k, v; the norms' 2 × 2 weights), 3 blocks per SM for the 16-bit GEMM (`tcblocks`), against
# the build before (.gpu-old/, or $CVC_OLD_BIN).
#   CVC_WAVE_PARTS=tests: every GPU test on the new build (bench/gpu-suite.sh);
#   CVC_WAVE_PARTS=bench: ViT b128 and seed b1024 in tf32, bf16 and fp32, old and new builds
#     in turn ($CVC_WAVE_ROUNDS rounds, default 2), the new one also with the choices of
#     $CVC_WAVE_VARIANTS (default `launch=stream` in tf32, `tcblocks=4` in bf16). Round 1 ran
#     on a build that also had `tcld=32` (32-bit fragment loads of the TF32 GEMM's interleaved
#     planes) and `attnblocks=3` (3 blocks per SM for the tensor-core attention), both taken
#     out after it (slower or no faster: bench/RESULTS.md);
#   CVC_WAVE_PARTS=jax: the JAX ViT (bench/vit/jax_vit.py) at 256 tokens, batch 128, in tf32
#     (its default precision) and fp32, in the same call.
# Builds nothing; summary in $OUT, a table last.
. "$(dirname "$0")/gpu-prologue.sh"
NEW=${CVC_NEW_BIN:-.gpu/gpu}
OLD=${CVC_OLD_BIN:-.gpu-old/gpu}
for part in ${CVC_WAVE_PARTS:-tests bench}; do
  case $part in
    tests)
      CVC_SUITE_LIMIT=${CVC_SUITE_LIMIT:-420}
      . bench/gpu-suite.sh
      ;;
    bench)
      for round in ${CVC_WAVE_ROUNDS:-1 2}; do
        OUT=$W CVC_GPU_TEST_BIN=$OLD CVC_TC_APPEND=1 CVC_TC_TAG=-old$round CVC_TC_PROFILE=0 \
          CVC_TC_RUNS="vit_sar 128 tf32 default|vit_sar 128 bf16 default|vit_sar 128 fp32 default|seed_cnn 1024 tf32 default|seed_cnn 1024 bf16 default|seed_cnn 1024 fp32 default" \
          bash bench/gpu-tc.sh bench >/dev/null
        OUT=$W CVC_GPU_TEST_BIN=$NEW CVC_TC_APPEND=1 CVC_TC_TAG=-new$round CVC_TC_PROFILE=0 \
          CVC_TC_RUNS="vit_sar 128 tf32 default|vit_sar 128 bf16 default|vit_sar 128 fp32 default|seed_cnn 1024 tf32 default|seed_cnn 1024 bf16 default|seed_cnn 1024 fp32 default|${CVC_WAVE_VARIANTS:-vit_sar 128 tf32 launch=stream|seed_cnn 1024 tf32 launch=stream|vit_sar 128 bf16 tcblocks=4|seed_cnn 1024 bf16 tcblocks=4}" \
          bash bench/gpu-tc.sh bench >/dev/null
      done
      cat "$W/summary.txt" | grep -v '^{' | tail -24 >>"$S"
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
grep -E "^== |exit|test result|mismatch|panicked|step ms|cvc_" "$S" | grep -v '^{' | tail -40
