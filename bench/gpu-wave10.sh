#!/usr/bin/env bash
# H200 run of 2026-12-03 (afternoon), the U-Net at batch 6144 side by side (cvc and PyTorch
# eager) after the host work of a step (gather, staging, prediction count) and the synthetic
# scenes' generation were split over threads; cvc's log and metrics are kept.
# Builds nothing (.gpu/cvc). One summary file in $OUT.
set -u
cd "$(dirname "$0")/.."
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
. bench/gpu-env.sh >/dev/null
export CVC_GPU_BIN=.gpu
O=${OUT:-/tmp}
S=$O/summary.txt
say() { tee -a "$S"; }
date -u +%T | say
( OUT=/tmp/w10 timeout 380 bash bench/gpu-unet.sh --batch 6144 --steps 3 --no-train --no-compile --no-jax --peer-timeout 120 2>&1 | tail -6 ) | say
date -u +%T | say
grep -h '"tool": "cvc"' /tmp/w10/unet/cvc.jsonl | say
cp /tmp/w10/unet/cvc_unet.log "$O/cvc_unet.log" 2>/dev/null
cp /tmp/w10/unet/cvc_unet_run/metrics.jsonl "$O/metrics.jsonl" 2>/dev/null
