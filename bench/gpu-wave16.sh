#!/usr/bin/env bash
# H200 run of 2026-12-03 (night): every GPU test on this build (.gpu/gpu), in five processes
# side by side (the tests compare against the f64 interpreter on the CPU, which is what takes
# the time; none of them measures device memory):
# 1. every example forward and backward, and trained with the real plan (fp32);
# 2. 64-bit indexed kernels;
# 3. fixtures, volumes, attention, batched matmuls, check mode, overlapped steps;
# 4. the reduced-precision end-to-end error report;
# 5. tf32, bf16 and fp16 on the examples, kernel by kernel.
# Builds nothing. The summary and one archive of logs in $OUT.
. "$(dirname "$0")/gpu-prologue.sh"
export CVC_SUITE_LIMIT=${CVC_SUITE_LIMIT:-520}
. bench/gpu-suite.sh
tar czf "$O/logs.tgz" -C "$W" . 2>/dev/null
