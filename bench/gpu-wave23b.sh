#!/usr/bin/env bash
# H200 run of 2026-12-04 (third session), the old build's ViT rows that bench/gpu-wave23.sh
# lost (the old test binary, built in /work/oldtree, looks for the examples there): the ViT at
# 256 tokens, batch 128, build of 6f72912 (.gpu-old) and this build (.gpu) in turn, fp32
# (profiled) then tf32. Builds nothing; summary in $OUT.
. "$(dirname "$0")/gpu-prologue.sh"
[ -e /work/oldtree ] || ln -s "$PWD" /work/oldtree
for p in fp32 tf32; do
  OUT=$W CVC_TC_APPEND=1 CVC_GPU_TEST_BIN=.gpu-old/gpu CVC_TC_TAG=-old CVC_TC_RUNS="vit_sar 128 $p default" bash bench/gpu-tc.sh bench >/dev/null
  OUT=$W CVC_TC_APPEND=1 CVC_TC_RUNS="vit_sar 128 $p default" bash bench/gpu-tc.sh bench >/dev/null
done
cat "$W/summary.txt" >>"$S"
rm -f "$W/b.out"
tar czf "$O/logs.tgz" -C "$W" . 2>/dev/null
grep -v -E '^\{"choice|^ +[0-9.]+ ms +k[0-9]' "$S" | tail -30
