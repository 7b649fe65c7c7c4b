#!/usr/bin/env bash
# H200 run of 2026-12-04 (fourth session): attention on TF32 tensor cores
# (compiler/src/back/cuda/attention_tc.rs, KernelConfig `attn=tc|fma`).
# 1. the attention kernels against the interpreter in fp32 and TF32 (fused and unfused);
# 2. bench_attention in fp32 and TF32 (ViT attention, B 128, H 3, T = S = 256, D 64);
# 3. the examples whose path contains `vit` (CVC_WAVE_FILES) in TF32 and bf16, kernel by kernel;
# 4. the ViT at 256 tokens, batch 128, tf32 and bf16, attention on tensor cores vs FMA.
# Builds nothing; CVC_WAVE_PARTS picks parts (default "1 2 3 4"). Summary in $OUT.
. "$(dirname "$0")/gpu-prologue.sh"
for part in ${CVC_WAVE_PARTS:-1 2 3 4}; do
  case $part in
    1)
      CVC_REQUIRE_GPU=1 timeout 300 .gpu/gpu --test-threads=1 --nocapture attention_kernels_match >"$W/attn-test.log" 2>&1
      echo "== attention_kernels_match_the_interpreter (fp32, tf32) exit $?" | tee -a "$S"
      grep -E "^test |test result|FAILS|tensor-core attention" "$W/attn-test.log" | cut -c1-200 | tee -a "$S"
      grep -A3 "mismatches:" "$W/attn-test.log" | head -12 | cut -c1-400 | tee -a "$S"
      ;;
    2)
      CVC_REQUIRE_GPU=1 timeout 150 .gpu/gpu --ignored --nocapture --test-threads=1 bench_attention >"$W/b.out" 2>"$W/bench-attn.err"
      echo "== bench_attention exit $?" | tee -a "$S"
      grep -E "at batch|ms " "$W/bench-attn.err" | tee -a "$S"
      grep -h -o '{"attention.*}' "$W/b.out" | tee -a "$S"
      ;;
    3)
      CVC_PRECISION_FIXTURES=1 CVC_PRECISION_FILES=${CVC_WAVE_FILES:-vit} CVC_PRECISION_LIST=tf32,bf16,fp16 CVC_REQUIRE_GPU=1 timeout 240 \
        .gpu/gpu reduced_precision_kernels_match_the_interpreter_within_their_format --test-threads=1 --nocapture \
        >"$W/precision.log" 2>&1
      echo "== reduced_precision_kernels (${CVC_WAVE_FILES:-vit}; tf32, bf16, fp16) exit $?" | tee -a "$S"
      grep -E "mismatches$|test result" "$W/precision.log" | cut -c1-200 | tee -a "$S"
      grep -A4 "mismatches:" "$W/precision.log" | head -12 | cut -c1-400 | tee -a "$S"
      ;;
    4)
      OUT=$W CVC_TC_PROFILE=0 CVC_TC_RUNS="vit_sar 128 tf32 default|vit_sar 128 tf32 attn=fma|vit_sar 128 bf16 default|vit_sar 128 bf16 attn=fma|vit_sar 128 tf32 default" \
        bash bench/gpu-tc.sh bench >/dev/null
      cat "$W/summary.txt" >>"$S"
      ;;
  esac
done
rm -f "$W/b.out"
tar czf "$O/logs.tgz" -C "$W" . 2>/dev/null
grep -v -E '^\{"choice|^ +[0-9.]+ ms +k[0-9]' "$S" | tail -40
