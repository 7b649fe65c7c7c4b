#!/usr/bin/env bash
# H200 run of 2026-12-04 (fourth session), last call: every GPU test on the final build
# (tensor-core attention, interleaved complex GEMM planes) in five processes side by side
# (bench/gpu-suite.sh). Builds nothing; summary in $OUT.
. "$(dirname "$0")/gpu-prologue.sh"
CVC_SUITE_LIMIT=${CVC_SUITE_LIMIT:-420}
. bench/gpu-suite.sh
tar czf "$O/logs.tgz" -C "$W" . 2>/dev/null
grep -E "^== |exit|test result|mismatch|panicked" "$S"
