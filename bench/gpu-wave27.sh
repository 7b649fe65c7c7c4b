#!/usr/bin/env bash
# H200 run of 2026-12-04 (fourth session): the tensor-core GEMM's complex operands in one
# interleaved float2 plane under `cp.async` staging (8-byte copies, 64-bit fragment loads)
# against the separate re/im planes of the build before (.gpu-old/ or $CVC_OLD_BIN):
# 1. every example and fixture one step in tf32, kernel by kernel, with the new build;
# 2. ViT b128 and seed b1024 in tf32, old and new builds alternating (two rounds).
# Builds nothing; summary in $OUT, a table last.
. "$(dirname "$0")/gpu-prologue.sh"
NEW=${CVC_NEW_BIN:-.gpu/gpu}
OLD=${CVC_OLD_BIN:-.gpu-old/gpu}
OUT=$W CVC_GPU_TEST_BIN=$NEW CVC_TC_TESTS="default:tf32:1" bash bench/gpu-tc.sh tests >/dev/null
cat "$W/summary.txt" >>"$S"; : >"$W/summary.txt"
for round in 1 2; do
  for b in old new; do
    bin=$OLD; [ $b = new ] && bin=$NEW
    OUT=$W CVC_GPU_TEST_BIN=$bin CVC_TC_APPEND=1 CVC_TC_TAG=-$b$round CVC_TC_PROFILE=0 \
      CVC_TC_RUNS="vit_sar 128 tf32 default|seed_cnn 1024 tf32 default" bash bench/gpu-tc.sh bench >/dev/null
  done
done
cat "$W/summary.txt" | grep -v '^{' | tail -12 >>"$S"
grep -h '^{' "$W/tc.jsonl" >>"$S"
rm -f "$W/b.out"
tar czf "$O/logs.tgz" -C "$W" . 2>/dev/null
grep -v '^{' "$S" | tail -30
