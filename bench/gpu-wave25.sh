#!/usr/bin/env bash
# H200 run of 2026-12-04 (third session), after the forward kernels' P*V accumulation moved
# into one helper (`attn_pv`): the attention kernels against the interpreter (fused and
# unfused), bench_attention, and the ViT at 256 tokens, batch 128, fp32, to show that the
# kernels' speed is unchanged. Builds nothing; summary in $OUT.
. "$(dirname "$0")/gpu-prologue.sh"
CVC_REQUIRE_GPU=1 timeout 200 .gpu/gpu --test-threads=1 attention_kernels_match >"$W/attn-test.log" 2>&1
echo "== attention_kernels_match_the_interpreter exit $?" | tee -a "$S"
grep -E "^test |test result" "$W/attn-test.log" | cut -c1-160 | tee -a "$S"
CVC_REQUIRE_GPU=1 timeout 100 .gpu/gpu --ignored --nocapture --test-threads=1 bench_attention >"$W/b.out" 2>"$W/bench-attn.err"
echo "== bench_attention exit $?" | tee -a "$S"
grep -E "at batch|ms " "$W/bench-attn.err" | tee -a "$S"
OUT=$W CVC_TC_RUNS="vit_sar 128 fp32 default" bash bench/gpu-tc.sh bench >/dev/null
cat "$W/summary.txt" >>"$S"
rm -f "$W/b.out"
tar czf "$O/logs.tgz" -C "$W" . 2>/dev/null
grep -v -E '^\{"choice|^ +[0-9.]+ ms +k[0-9]' "$S" | tail -30
