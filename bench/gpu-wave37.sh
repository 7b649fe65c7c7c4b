#!/usr/bin/env bash
# Device call of 2026-12-07 (third session), issue 13 with the 16-bit `wgmma` default
# (`tc16=auto` = `wgmma` on compute capability 9.0) and vectorised elementwise and reduction
# kernels (`ewvec=4`, compiler/src/back/cuda/kernels.rs `elementwise_vector`, `reduce`: up to
# four consecutive elements per thread, one load of up to 16 bytes; `ewvec=1`: as before):
#   check: every example's kernels on the GPU against the f64 interpreter (tf32, bf16);
#   train: the RF example trained in fp32, bf16 and fp16 (same seed, 10 epochs) with the new
#          default's products — the convergence figure of README was measured with the 16-bit
#          `mma.sync` products;
#   bench: the seed network at batch 1024 in bf16, tf32 and fp32, and the ViT at batch 128 in
#          fp32, default against `ewvec=1` side by side, profiled;
#   jax:   the JAX seed network at its default precision and in fp32, same call;
#   ncu:   Nsight Compute on one bf16 step's contractions (`gemm` kernels): speed of light,
#          occupancy, stall reasons, tensor-pipe activity — where the 16-bit products lose.
# CVC_W37_PARTS picks from "check train bench jax ncu" (default "bench jax check"); CVC_W37_NCU_SPEC
# the kernel choice that ncu profiles (default "default").
# Builds nothing (.gpu/gpu, .gpu/cvc); a table last.
. "$(dirname "$0")/gpu-prologue.sh"
GPU=${CVC_GPU_TEST_BIN:-.gpu/gpu}
for part in ${CVC_W37_PARTS:-bench jax check}; do
  case $part in
    check)
      OUT=$W CVC_GPU_TEST_BIN=$GPU CVC_TC_TESTS="${CVC_W37_CHECKS:-ewvec=4:bf16,tf32:0}" bash bench/gpu-tc.sh tests >/dev/null
      grep -h -E "^tests" "$W/summary.txt" | tee -a "$S"
      grep -h -E "mismatches$|panicked|FAIL" "$W"/tests-*.log | tail -20 | tee -a "$S"
      ;;
    train)
      for p in fp32 bf16 fp16; do
        rm -rf "$W/train-rf-$p"
        timeout 150 .gpu/cvc train examples/rf_modulation.cvnn --device cuda --precision $p --out "$W/train-rf-$p" -q \
          >"$W/train-rf-$p.log" 2>&1
        echo "train rf $p: exit $?" | tee -a "$S"
        cp "$W/train-rf-$p/metrics.jsonl" "$O/train-rf-$p.jsonl" 2>/dev/null
      done
      python3 - "$O" <<'PY' | tee -a "$S"
import json, os, sys
for p in ("fp32", "bf16", "fp16"):
    f = os.path.join(sys.argv[1], "train-rf-%s.jsonl" % p)
    if not os.path.exists(f):
        print("rf %s: no metrics" % p); continue
    r = [json.loads(l) for l in open(f) if l.strip() and "train_loss" in l]
    print("rf %s: " % p + " ".join("%.4f/%.1f" % (m["train_loss"], 100 * (m.get("val_acc") or 0)) for m in r)
          + " | last val acc %s, step %.3f ms" % (r[-1].get("val_acc"), r[-1]["step_ms"]) if r else "rf %s: empty" % p)
PY
      ;;
    bench)
      OUT=$W CVC_GPU_TEST_BIN=$GPU CVC_TC_RUNS="${CVC_W37_RUNS:-seed_cnn 1024 bf16 ewvec=4|seed_cnn 1024 bf16 ewvec=1|seed_cnn 1024 tf32 ewvec=4|seed_cnn 1024 tf32 ewvec=1|seed_cnn 1024 bf16 ewvec=4|seed_cnn 1024 bf16 ewvec=1|vit_sar 128 fp32 ewvec=4|vit_sar 128 fp32 ewvec=1|seed_cnn 1024 fp32 ewvec=4}" \
        CVC_TC_PROFILE_ALL=1 bash bench/gpu-tc.sh bench >/dev/null
      grep -v '^{' "$W/summary.txt" | grep -E "profile|gemm |  [0-9.]+ ms  k|^seed|^file" | head -150 >>"$S"
      grep -h '^{' "$W/tc.jsonl" >>"$S"
      ;;
    jax)
      for flag in "" --fp32; do
        PYTHONUNBUFFERED=1 timeout 120 python3 bench/jax_seed_cvnn.py $flag 2>>"$W/jax.err" | tail -1 | tee -a "$S"
      done
      ;;
    ncu)
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
      CVC_KERNELS=${CVC_W37_NCU_SPEC:-default} CVC_BENCH_FILE=examples/seed_cnn.cvnn CVC_BENCH_BATCH=1024 CVC_BENCH_PRECISIONS=bf16 \
        CVC_BENCH_PROFILE= CVC_BENCH_STEPS=1 timeout ${CVC_W37_NCU_LIMIT:-200} "$NCU" --clock-control none \
        -k "regex:${CVC_W37_NCU_KERNELS:-gemm}" --launch-count ${CVC_W37_NCU_COUNT:-11} \
        --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
        --metrics gpu__time_duration.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed_op_ldgsts.sum,lts__t_sector_hit_rate.pct,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active \
        "$GPU" bench_seed_cnn --ignored --nocapture --test-threads=1 >"$W/ncu.txt" 2>&1
      echo "ncu: exit $?" | tee -a "$S"
      cp "$W/ncu.txt" "$O/ncu.txt"
      grep -E "^  k[0-9]+_|gpu__time|gmma|hmma|wavefronts|bank_conflicts|ldgsts|hit_rate|dram__|inst_executed|issue_active|Stall|Warp Cycles|Eligible|Issued Warp|Occupancy|Registers|Block Limit|Compute \(SM\) Throughput|Memory Throughput|Duration" "$W/ncu.txt" \
        | sed 's/  */ /g' | cut -c1-150 | head -260 >>"$S"
      ;;
  esac
done
rm -f "$W/b.out"
tar czf "$O/logs.tgz" -C "$W" . 2>/dev/null
grep -E "^tests|mismatch|panicked|^train|^rf |^seed|^file|jax|step|ncu:" "$S" | grep -v "^{" | tail -30
