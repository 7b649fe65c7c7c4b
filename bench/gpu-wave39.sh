#!/usr/bin/env bash
# Device call of 2026-12-08 (seventh session): every GPU test (bench/gpu-suite.sh: examples and
# fixtures forward and backward against the f64 interpreter, 64-bit kernels, attention, check
# mode, overlapped steps, reduced precision) on .gpu/gpu, the build with batched small kernels
# (`ewbatch=16`, back/cuda/kernels.rs `batches`), whose members' blocks run concurrently only
# on a real device. Builds nothing; statuses last.
. "$(dirname "$0")/gpu-prologue.sh"
CVC_SUITE_LIMIT=${CVC_SUITE_LIMIT:-300}
. bench/gpu-suite.sh
tar czf "$O/logs.tgz" -C "$W" . 2>/dev/null
grep -E "exit|test result" "$S" | tail -12
