# Sourced by the wave scripts after bench/gpu-prologue.sh: every GPU test on .gpu/gpu in five
# processes side by side (the tests compare against the f64 interpreter on the CPU, which is
# what takes the time; none of them measures device memory), each cut at $CVC_SUITE_LIMIT
# seconds (default 300); statuses, test lines and mismatches go to $S, logs to $W.
# 1. every example forward and backward, and trained with the real plan (fp32);
# 2. 64-bit indexed kernels;
# 3. fixtures, volumes, attention, batched matmuls, check mode, overlapped steps;
# 4. the reduced-precision end-to-end error report;
# 5. tf32, bf16 and fp16 on the examples, kernel by kernel.
suite_run() {
  local tag=$1; shift
  local t0=$(date +%s)
  CVC_REQUIRE_GPU=1 timeout ${CVC_SUITE_LIMIT:-300} .gpu/gpu --test-threads=1 "$@" >"$W/$tag.log" 2>&1
  echo "$tag: exit $? in $(( $(date +%s) - t0 )) s" >"$W/$tag.status"
}
suite_run examples every_example_ &
suite_run sixty_four sixty_four_bit &
suite_run rest every_fixture volume_layers attention_kernels batched_matmul check_mode overlapped_steps &
suite_run report reduced_precision_end_to_end &
suite_run precision reduced_precision_kernels &
wait
for t in examples sixty_four rest report precision; do
  cat "$W/$t.status" | tee -a "$S"
  grep -E "^test |test result" "$W/$t.log" | cut -c1-160 | tee -a "$S"
  grep -h -i -E "mismatch|panicked" "$W/$t.log" | head -6 | cut -c1-300 | tee -a "$S"
done
