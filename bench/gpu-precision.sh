#!/usr/bin/env bash
# Reduced precision on the GPU (issue 13): TF32/bf16/fp16 against the f64 interpreter, bf16 and
# fp16 training side by side with fp32 (same seed and epochs), and the seed-CNN benchmark in
# all four precisions next to JAX (fp32, default) and PyTorch (fp32, tf32, bf16 autocast).
#
# Builds nothing: runs $CVC_GPU_BIN (default .gpu/) `cvc` and `gpu` (the tests/tests/gpu.rs
# test binary), made on the build machine as bench/gpu.sh says.
# Usage: bench/gpu-precision.sh [tests] [train] [bench]   (default: all three)
set -u
cd "$(dirname "$0")/.."
BIN=${CVC_GPU_BIN:-.gpu}
LOG=${OUT:-bench/out}
mkdir -p "$LOG"
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; } 2>/dev/null
. bench/gpu-env.sh
parts=${*:-tests train bench}
status=0

if [[ " $parts " == *" tests "* ]]; then
  echo "== reduced precision vs the f64 interpreter (one SGD step, every example and fixture) =="
  CVC_REQUIRE_GPU=1 "$BIN/gpu" reduced_precision --test-threads=1 --nocapture >"$LOG/precision-tests.log" 2>&1
  rc=$?
  grep -E "worst|mismatch|Tf32: |Bf16: |Fp16: |test result|panicked" "$LOG/precision-tests.log" | grep -v "^cuda:" | tail -150
  [ $rc = 0 ] || { echo "PRECISION TESTS FAILED"; status=1; }
fi

if [[ " $parts " == *" train "* ]]; then
  echo "== training side by side: fp32, bf16, fp16 (same seed and epochs) =="
  for ex in rf_modulation seed_cnn; do
    extra=""
    [ "$ex" = seed_cnn ] && extra="--epochs 4 --batch 256"
    for p in fp32 bf16 fp16; do
      rm -rf "$LOG/train-$ex-$p"
      "$BIN/cvc" train "examples/$ex.cvnn" --device cuda --precision "$p" $extra --out "$LOG/train-$ex-$p" -q \
        >"$LOG/train-$ex-$p.log" 2>&1 || { echo "$ex $p failed:"; tail -5 "$LOG/train-$ex-$p.log"; status=1; }
    done
  done
  python3 - "$LOG" <<'PY'
import json, os, sys
log = sys.argv[1]
for ex in ("rf_modulation", "seed_cnn"):
    runs = {}
    for p in ("fp32", "bf16", "fp16"):
        f = os.path.join(log, "train-%s-%s" % (ex, p), "metrics.jsonl")
        if os.path.exists(f):
            runs[p] = [json.loads(l) for l in open(f) if l.strip() and "train_loss" in l]
    print("\n%s: per epoch train loss / val acc (%%)" % ex)
    print("%5s " % "epoch" + "".join("%24s" % p for p in runs))
    for e in range(max((len(r) for r in runs.values()), default=0)):
        cells = []
        for p, r in runs.items():
            if e < len(r):
                m = r[e]
                acc = "%.1f" % (100 * m["val_acc"]) if m.get("val_acc") is not None else "-"
                extra = " s%d" % m["skipped_steps"] if "skipped_steps" in m else ""
                cells.append("%24s" % ("%.4f / %s%s" % (m["train_loss"], acc, extra)))
            else:
                cells.append("%24s" % "")
        print("%5d " % (e + 1) + "".join(cells))
    for p, r in runs.items():
        if r:
            m = r[-1]
            print("  %s: last val acc %s, step %.3f ms, peak %.1f MiB, arena %.1f MiB%s" % (
                p, m.get("val_acc"), m["step_ms"], (m.get("measured_peak_bytes") or 0) / 2**20,
                m["planned_arena_bytes"] / 2**20,
                ", loss scale %g, %d skipped in the last epoch" % (m["loss_scale"], m["skipped_steps"]) if "loss_scale" in m else ""))
PY
fi

if [[ " $parts " == *" bench "* ]]; then
  echo "== seed_cnn batch 1024: cvc fp32 / tf32 / bf16 / fp16 =="
  CVC_REQUIRE_GPU=1 "$BIN/gpu" --ignored bench_seed_cnn --nocapture --test-threads=1 >"$LOG/cvc-precision.jsonl" 2>"$LOG/cvc-precision.err" || { echo "cvc bench failed"; tail -20 "$LOG/cvc-precision.err"; status=1; }
  grep '"mode"' "$LOG/cvc-precision.jsonl"
  echo "== peers =="
  PYTHONUNBUFFERED=1 python3 bench/jax_seed_cvnn.py --fp32 >"$LOG/jax-fp32.jsonl" 2>"$LOG/jax-fp32.err" || echo "jax fp32 failed"
  PYTHONUNBUFFERED=1 python3 bench/jax_seed_cvnn.py >"$LOG/jax-default.jsonl" 2>"$LOG/jax-default.err" || echo "jax default failed"
  PYTHONUNBUFFERED=1 python3 bench/seed_cvnn.py --numerics bf16 --variants split_cast native >"$LOG/torch-bf16.jsonl" 2>"$LOG/torch-bf16.err" || echo "torch bf16 failed"
  PYTHONUNBUFFERED=1 python3 bench/seed_cvnn.py --numerics tf32 --variants split_cast native --no-compile >"$LOG/torch-tf32.jsonl" 2>"$LOG/torch-tf32.err" || echo "torch tf32 failed"
  python3 - "$LOG" <<'PY'
import glob, json, os, sys
log = sys.argv[1]
rows = {}
for f in ("cvc-precision", "jax-fp32", "jax-default", "torch-bf16", "torch-tf32"):
    p = os.path.join(log, f + ".jsonl")
    if not os.path.exists(p):
        continue
    for line in open(p):
        if "{" not in line:
            continue
        try:
            r = json.loads(line[line.index("{"):])
        except ValueError:
            continue
        if "mode" in r:
            key = r["mode"] if not f.startswith("torch") else "torch_%s_%s" % (f.split("-")[1], r["mode"])
            rows[key] = r
print("\n%-28s %10s %10s" % ("variant (batch 1024)", "peak MiB", "step ms"))
for k, r in rows.items():
    if "error" in r:
        print("%-28s  ERROR %s" % (k, r["error"][:90]))
    else:
        print("%-28s %10.1f %10.3f" % (k, r.get("peak_mib") or 0, r["step_ms"]))
def step(k):
    return rows.get(k, {}).get("step_ms")
jd = [r["step_ms"] for k, r in rows.items() if k.startswith("jax") and "default" in k and "step_ms" in r]
jf = [r["step_ms"] for k, r in rows.items() if k.startswith("jax") and "fp32" in k and "step_ms" in r]
jd, jf = (min(jd) if jd else None), (min(jf) if jf else None)
c = {p: rows.get("cvc_" + p, {}) for p in ("fp32", "tf32", "bf16", "fp16")}
print("\ntargets (issue 13):")
def ratio(a, b):
    return "%.2f" % (a / b) if a and b else "n/a"
print("  tf32 step / JAX default   %s  (target <= 0.5)" % ratio(c["tf32"].get("step_ms"), jd))
print("  bf16 step / JAX default   %s  (target <= 0.35)" % ratio(c["bf16"].get("step_ms"), jd))
print("  bf16 peak / cvc fp32 peak %s  (target <= 0.55)" % ratio(c["bf16"].get("peak_mib"), c["fp32"].get("peak_mib")))
print("  fp32 step / JAX fp32      %s  (target <= 0.5)" % ratio(c["fp32"].get("step_ms"), jf))
print("  fp16 step / JAX default   %s" % ratio(c["fp16"].get("step_ms"), jd))
PY
fi
exit $status
