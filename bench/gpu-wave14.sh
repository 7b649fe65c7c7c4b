#!/usr/bin/env bash
# H200 run of 2026-12-03 (evening): the end-to-end reduced-precision error report
# (`reduced_precision_end_to_end_error_report`, every example and fixture, one SGD step in
# tf32, bf16 and fp16 against the f64 step) with this build (.gpu/) and, at the same time, the
# build of ac811b7 (.gpu-old/), to tell a regression from an older failure.
set -u
cd "$(dirname "$0")/.."
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
O=${OUT:-/tmp}
. bench/gpu-env.sh >/dev/null
for b in gpu gpu-old; do
  CVC_CACHE_DIR=$(mktemp -d) CVC_REQUIRE_GPU=1 timeout 270 .$b/gpu reduced_precision_end_to_end_error_report \
    --test-threads=1 --nocapture >"$O/$b.log" 2>&1 &
done
wait
for b in gpu gpu-old; do
  echo "== $b: $(grep -h 'test result' "$O/$b.log" | cut -c1-60)"
  grep -h -A12 "gross errors" "$O/$b.log" | head -14 | cut -c1-250
done
