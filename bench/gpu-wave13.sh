#!/usr/bin/env bash
# H200 run of 2026-12-03 (evening): correctness of the build that wave 11 timed (branch-free
# gathers, modules compiled as translation units), after the (tap, channel) K order of wave 12
# was taken out again:
# 1. every GPU test (fp32: every example and fixture forward and backward and trained with the
#    real plan against the f64 interpreter; tf32, bf16 and fp16 on the examples; attention,
#    volumes, 64-bit indexing, check mode, overlapped steps);
# 2. tf32 on the examples and nine fixtures, kernel by kernel.
# Builds nothing (.gpu/). The summary and one archive of logs in $OUT.
set -u
cd "$(dirname "$0")/.."
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
O=${OUT:-/tmp}
W=$(mktemp -d)
S=$O/summary.txt
. bench/gpu-env.sh | tee -a "$S"
start=$(date +%s)
CVC_REQUIRE_GPU=1 timeout 420 .gpu/gpu --test-threads=1 >"$W/suite.log" 2>&1
echo "GPU suite: exit $? in $(( $(date +%s) - start )) s" | tee -a "$S"
grep -E "^test |test result" "$W/suite.log" | tee -a "$S"
grep -h -i -E "mismatch|panicked" "$W/suite.log" | head -10 | cut -c1-300 | tee -a "$S"
export CVC_PRECISION_FILES=examples/,polsar_unet_tiny,vit_tiny,tuples,gru_tiny,sequence_matmul,volume3d,segmentation_2d,mri_volume_tiny
OUT=$W CVC_TC_TESTS="default:tf32:1" bash bench/gpu-tc.sh tests
cat "$W/summary.txt" >>"$S"
tar czf "$O/logs.tgz" -C "$W" . 2>/dev/null
tail -30 "$S"
