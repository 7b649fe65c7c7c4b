#!/usr/bin/env bash
# H200 run of 2026-12-03 (evening), issues 11 and 13:
# 1. start-up: the ViT's 1,550 training kernels compiled from a cold cache, as translation
#    units of about 64 KB compiled in parallel (this build) against one module (the build
#    of ac811b7 in .gpu-old/);
# 2. correctness: every example and nine fixtures one step in bf16 and fp16, kernel by kernel
#    against the f64 interpreter (the gathers now compute indices without branches);
# 3. speed: the seed network at batch 1024 in bf16, fp16, tf32 and fp32, side by side with the
#    old build (bf16, fp32) and JAX at its default precision.
# Builds nothing (.gpu/, .gpu-old/). The summary and one archive of logs in $OUT.
set -u
cd "$(dirname "$0")/.."
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
O=${OUT:-/tmp}
W=$(mktemp -d)
S=$O/summary.txt
. bench/gpu-env.sh | tee -a "$S"
# 1. The first start of `cvc train` on the ViT: the `cuda:` lines of the train and validation
#    modules, from an empty cache (then the run is stopped).
for b in .gpu/cvc:new .gpu-old/cvc:old; do
  bin=${b%%:*} tag=${b##*:}
  cache=$(mktemp -d)
  log=$W/vit-start-$tag.log
  CVC_CACHE_DIR=$cache "$bin" train examples/vit_sar.cvnn --device cuda --epochs 1 --out "$W/vit-$tag" --overwrite -q >"$log" 2>&1 &
  pid=$!
  t0=$(date +%s)
  while kill -0 $pid 2>/dev/null && [ $(( $(date +%s) - t0 )) -lt ${CVC_START_LIMIT:-170} ]; do
    [ "$(grep -c '^cuda:' "$log")" -ge 2 ] && break
    sleep 0.5
  done
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
  echo "vit start ($tag, $(nproc) cores): $(grep '^cuda:' "$log" | cut -c1-150 | tr '\n' '|')" | tee -a "$S"
  ls "$cache" | wc -l | sed "s/^/vit start ($tag): cache files /" | tee -a "$S"
done
# 2. Reduced precision, kernel by kernel.
export CVC_PRECISION_FILES=examples/,polsar_unet_tiny,vit_tiny,tuples,gru_tiny,sequence_matmul,volume3d,segmentation_2d,mri_volume_tiny
OUT=$W CVC_TC_TESTS="default:bf16:1 default:fp16:1" bash bench/gpu-tc.sh tests
cat "$W/summary.txt" >>"$S"; : >"$W/summary.txt"
# 3. Speed, side by side.
OUT=$W CVC_TC_RUNS="seed_cnn 1024 bf16 default|seed_cnn 1024 fp16 default|seed_cnn 1024 tf32 default|seed_cnn 1024 fp32 default|seed_cnn 1024 bf16 tc=prefetch" \
  bash bench/gpu-tc.sh bench >/dev/null
OUT=$W CVC_TC_APPEND=1 CVC_GPU_TEST_BIN=.gpu-old/gpu CVC_TC_TAG=-old \
  CVC_TC_RUNS="seed_cnn 1024 bf16 default|seed_cnn 1024 fp32 default" bash bench/gpu-tc.sh bench >/dev/null
cat "$W/summary.txt" >>"$S"
PYTHONUNBUFFERED=1 timeout 120 python3 bench/jax_seed_cvnn.py 2>"$W/jax-default.err" | tee -a "$S"
tar czf "$O/logs.tgz" -C "$W" . 2>/dev/null
tail -42 "$S"
