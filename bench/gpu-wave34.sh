#!/usr/bin/env bash
# For the next device session (written 2026-12-05, fourth session, when no device was lent):
# the `wgmma` GEMM with copying warpgroups (`wgprod=1..3`, compiler/src/back/cuda/gemm.rs
# `emit_wgmma`) against the default, on one build (.gpu/gpu), through bench/gpu-wave33.sh.
#   1. check: every example one step, kernel by kernel against the f64 interpreter, under
#      wgprod=1 and wgprod=3 (tf32; fixtures too under wgprod=1);
#   2. bench: seed network (batch 1024) and ViT (batch 128), tf32: default, wgprod=1, 2, 3,
#      and wgprod=2 with a ring of 4 tiles (medians of 10 steps; the default profiled).
# Builds nothing; summary in $OUT, a table last.
cd "$(dirname "$0")/.."
# 2026-12-06: the old build's defaults (.gpu-old = f35a1fb, before the fetch dropped its
# always-true bounds tests) beside the new, and rows for `tctaps=mask` alone and with producers.
V="seed_cnn 1024 tf32 tctaps=mask|seed_cnn 1024 tf32 wgprod=1|seed_cnn 1024 tf32 wgprod=2"
V="$V|seed_cnn 1024 tf32 wgprod=1,tctaps=mask|seed_cnn 1024 tf32 wgprod=3,tctaps=mask|vit_sar 128 tf32 tctaps=mask"
CVC_WAVE_PARTS="${CVC_WAVE_PARTS:-bench check}" CVC_WAVE_OLD=${CVC_WAVE_OLD:-1} CVC_WAVE_PROFILE=${CVC_WAVE_PROFILE:-0} \
  CVC_WAVE_CHECKS="${CVC_WAVE_CHECKS:-default:tf32,bf16:0 tctaps=mask:tf32:0 wgprod=1:tf32:0}" \
  CVC_WAVE_VARIANTS="${CVC_WAVE34_VARIANTS:-$V}" exec bash bench/gpu-wave33.sh
