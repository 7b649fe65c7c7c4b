#!/usr/bin/env bash
# H200 run of 2026-12-04 (fifth session): where the TF32 GEMM rounds its copied operands
# (`tfround=frag|tile`) and how many blocks per SM its registers allow (`tcblocks=3`).
# Ran on a build that had the kernel choice `tfround`; it was taken out after this run
# (rounding in shared memory was 17% slower on the ViT, bench/RESULTS.md), so on later builds
# its rows fail with an unknown kernel choice.
# 1. every example and fixture one step in tf32, kernel by kernel, with `tfround=tile`;
# 2. ViT b128 and seed b1024 in tf32 (and bf16 with `tcblocks=3`), the variants in turn,
#    two rounds.
# Builds nothing; summary in $OUT, a table last.
. "$(dirname "$0")/gpu-prologue.sh"
[ "${CVC_WAVE_TESTS:-1}" = 1 ] && OUT=$W CVC_TC_TESTS="tfround=tile:tf32:1" bash bench/gpu-tc.sh tests >/dev/null
cat "$W/summary.txt" >>"$S"; : >"$W/summary.txt"
runs=""
for spec in default tfround=tile tcblocks=3 tfround=tile,tcblocks=3; do
  runs="$runs|vit_sar 128 tf32 $spec|seed_cnn 1024 tf32 $spec"
done
runs="$runs|vit_sar 128 bf16 default|vit_sar 128 bf16 tcblocks=3|seed_cnn 1024 bf16 default|seed_cnn 1024 bf16 tcblocks=3"
for round in ${CVC_WAVE_ROUNDS:-1 2}; do
  OUT=$W CVC_TC_APPEND=1 CVC_TC_TAG=-r$round CVC_TC_PROFILE=0 CVC_TC_RUNS="${runs#|}" \
    bash bench/gpu-tc.sh bench >/dev/null
done
cat "$W/summary.txt" | grep -v '^{' | tail -40 >>"$S"
grep -h '^{' "$W/tc.jsonl" >>"$S"
rm -f "$W/b.out"
tar czf "$O/logs.tgz" -C "$W" . 2>/dev/null
grep -v '^{' "$S" | tail -40
