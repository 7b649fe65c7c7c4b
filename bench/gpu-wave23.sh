#!/usr/bin/env bash
# H200 run of 2026-12-04 (third session; the second session's device output was lost with
# it): the attention forward that writes its log-sum-exp (`fusion::merge_attention_lse`,
# `attn_fwd_lse`) and the dk/dv accumulation's paired loads, against the build of 6f72912
# (.gpu-old) in the same call: bench_attention, the ViT at 256 tokens, batch 128, in fp32
# (profiled) and tf32; the fp32 GEMM's 3M complex products (`cmul=3m`) on the ViT and the seed
# network; the seed network at batch 1024 in fp32, tf32, bf16; JAX's ViT in fp32 and tf32 and
# JAX's seed step at its default precision. Builds nothing; summary in $OUT.
. "$(dirname "$0")/gpu-prologue.sh"
for b in old new; do
  bin=.gpu-$b/gpu; [ $b = new ] && bin=.gpu/gpu
  CVC_REQUIRE_GPU=1 timeout 100 $bin --ignored --nocapture --test-threads=1 bench_attention >"$W/b.out" 2>"$W/bench-attn-$b.err"
  echo "== $b: bench_attention exit $?" | tee -a "$S"
  grep -E "at batch|ms " "$W/bench-attn-$b.err" | tee -a "$S"
done
OUT=$W CVC_GPU_TEST_BIN=.gpu-old/gpu CVC_TC_TAG=-old \
  CVC_TC_RUNS="vit_sar 128 fp32 default|vit_sar 128 tf32 default" bash bench/gpu-tc.sh bench >/dev/null
OUT=$W CVC_TC_APPEND=1 \
  CVC_TC_RUNS="vit_sar 128 fp32 default|vit_sar 128 fp32 cmul=3m|vit_sar 128 tf32 default|seed_cnn 1024 fp32 default|seed_cnn 1024 fp32 cmul=3m|seed_cnn 1024 tf32 default|seed_cnn 1024 bf16 default" \
  bash bench/gpu-tc.sh bench >/dev/null
OUT=$W CVC_TC_APPEND=1 CVC_TC_PROFILE=0 CVC_BENCH_BUDGET=4.6GiB CVC_TC_TAG=-budget \
  CVC_TC_RUNS="vit_sar 128 fp32 default" bash bench/gpu-tc.sh bench >/dev/null
cat "$W/summary.txt" >>"$S"; : >"$W/summary.txt"
for p in fp32 tf32; do
  PYTHONPATH=bench/vit PYTHONUNBUFFERED=1 timeout 100 python3 bench/vit/jax_vit.py --tokens 256 --batch 128 \
    --precision $p --steps 5 2>"$W/jax-vit-$p.err" | tee -a "$S"
done
PYTHONUNBUFFERED=1 timeout 80 python3 bench/jax_seed_cvnn.py 2>"$W/jax-default.err" | tee -a "$S"
rm -f "$W/b.out"
tar czf "$O/logs.tgz" -C "$W" . 2>/dev/null
grep -v -E '^\{"choice|^ +[0-9]+ +k[0-9]' "$S" | tail -45
