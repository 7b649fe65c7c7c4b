#!/usr/bin/env bash
# cvc on an NVIDIA GPU: the GPU tests, a short RF training run, then the seed-CNN benchmark
# against the PyTorch and JAX references, with a comparison table printed last.
#
# Builds nothing: it runs prebuilt x86-64 binaries from $CVC_GPU_BIN (default .gpu/):
#   cvc  (target/release/cvc)   and   gpu  (the tests/tests/gpu.rs test binary, release).
# Make them on the build machine with:
#   cargo build --release && cargo test --release -p cvc-tests --test gpu --no-run
#   mkdir -p .gpu && cp target/release/cvc .gpu/ && cp "$(ls -t target/release/deps/gpu-* | grep -v '\.d$' | head -1)" .gpu/gpu
#
# Usage: bench/gpu.sh [--no-tests] [--no-train] [--no-peers]
# Logs go to $OUT (the device tool's output folder) or bench/out.
set -u
cd "$(dirname "$0")/.."
BIN=${CVC_GPU_BIN:-.gpu}
LOG=${OUT:-bench/out}
mkdir -p "$LOG"
TESTS=1 TRAIN=1 PEERS=1
for a in "$@"; do
  case "$a" in
    --no-tests) TESTS=0 ;;
    --no-train) TRAIN=0 ;;
    --no-peers) PEERS=0 ;;
    *) echo "unknown option $a" >&2; exit 2 ;;
  esac
done

. bench/gpu-env.sh

status=0
if [ "$TESTS" = 1 ]; then
  echo "== GPU tests (CUDA back end vs the f64 interpreter, every example) =="
  CVC_REQUIRE_GPU=1 "$BIN/gpu" --test-threads=1 --nocapture 2>&1 | tee "$LOG/gpu-tests.log" | grep -v '^\s*$' | tail -60
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "GPU TESTS FAILED"; status=1; }
fi

if [ "$TRAIN" = 1 ]; then
  echo "== cvc train examples/rf_modulation.cvnn --device cuda (its train section: 8 epochs) =="
  rm -rf "$LOG/rf"
  "$BIN/cvc" train examples/rf_modulation.cvnn --device cuda --out "$LOG/rf" -q 2>&1 | tail -15
  python3 - "$LOG/rf/metrics.jsonl" <<'EOF' || status=1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "train_loss" in r]
for r in rows:
    print("epoch %d  train_loss %.4f  val_acc %s  step_ms %.3f  peak %s" % (r["epoch"], r["train_loss"], r.get("val_acc"), r["step_ms"], r.get("measured_peak_bytes")))
# Converges: the loss falls by a tenth or more and validation accuracy is at least twice chance (5 classes).
ok = len(rows) >= 2 and rows[-1]["train_loss"] < 0.9 * rows[0]["train_loss"] and (rows[-1].get("val_acc") or 0) >= 0.4
print("RF training converges:", "yes" if ok else "NO")
sys.exit(0 if ok else 1)
EOF
fi

echo "== benchmark: examples/seed_cnn.cvnn, batch 1024 =="
CVC_REQUIRE_GPU=1 "$BIN/gpu" --ignored bench_seed_cnn --nocapture --test-threads=1 >"$LOG/cvc-bench.jsonl" 2>"$LOG/cvc-bench.err"
[ $? = 0 ] || { echo "cvc benchmark failed"; status=1; }
grep -v '^\s*$' "$LOG/cvc-bench.err" | grep -v '^running\|^test \|^successes\|^failures' | tail -30
grep '"mode"' "$LOG/cvc-bench.jsonl"
echo "-- cvc train examples/seed_cnn.cvnn --device cuda --epochs 2 --batch 1024 (end to end, host data) --"
rm -rf "$LOG/seed"
"$BIN/cvc" train examples/seed_cnn.cvnn --device cuda --epochs 2 --batch 1024 --out "$LOG/seed" -q 2>&1 | tail -5
python3 - "$LOG/seed/metrics.jsonl" <<'EOF' >>"$LOG/cvc-bench.jsonl" || true
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip() and "step_ms" in l]
r = rows[-1]
print(json.dumps(dict(mode="cvc_train_e2e", batch=1024, peak_mib=(r.get("measured_peak_bytes") or 0) / 2**20, step_ms=r["step_ms"])))
EOF
tail -1 "$LOG/cvc-bench.jsonl"

if [ "$PEERS" = 1 ]; then
  echo "== peers: PyTorch (fp32, tf32) and JAX (fp32, default) =="
  PYTHONUNBUFFERED=1 python3 bench/seed_cvnn.py --numerics fp32 >"$LOG/torch-fp32.jsonl" 2>"$LOG/torch-fp32.err" || echo "torch fp32 failed"
  PYTHONUNBUFFERED=1 python3 bench/seed_cvnn.py --numerics tf32 >"$LOG/torch-tf32.jsonl" 2>"$LOG/torch-tf32.err" || echo "torch tf32 failed"
  PYTHONUNBUFFERED=1 python3 bench/jax_seed_cvnn.py --fp32 >"$LOG/jax-fp32.jsonl" 2>"$LOG/jax-fp32.err" || echo "jax fp32 failed"
  PYTHONUNBUFFERED=1 python3 bench/jax_seed_cvnn.py >"$LOG/jax-default.jsonl" 2>"$LOG/jax-default.err" || echo "jax default failed"
fi

python3 - "$LOG" <<'EOF'
import glob, json, os, sys
rows = []
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.jsonl"))):
    tag = os.path.basename(f)[:-6]
    for line in open(f):
        line = line.strip()
        if "{" not in line:
            continue
        line = line[line.index("{"):]
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if "mode" not in r or "step_ms" not in r:
            continue
        numerics = "tf32" if ("tf32" in tag or "tf32" in r["mode"] or r["mode"].endswith("_default")) else "fp32"
        rows.append((r["mode"], numerics, r.get("peak_mib"), r["step_ms"]))
peers = [r for r in rows if not r[0].startswith("cvc")]
for numerics in ("fp32", "tf32"):
    ps = [r for r in peers if r[1] == numerics]
    best_peak = min((r[2] for r in ps if r[2]), default=None)
    best_step = min((r[3] for r in ps), default=None)
    print("\nseed_cnn, batch 1024, %s: ratios to the best peer peak (%s MiB) and fastest peer step (%s ms)" % (
        numerics, "%.0f" % best_peak if best_peak else "n/a", "%.2f" % best_step if best_step else "n/a"))
    print("%-24s %10s %10s %8s %8s" % ("variant", "peak MiB", "step ms", "peak x", "step x"))
    for r in [r for r in rows if r[1] == numerics or r[0] == "cvc_train_e2e" and numerics == "fp32"]:
        pr = "%.2f" % (r[2] / best_peak) if best_peak and r[2] else "-"
        sr = "%.2f" % (r[3] / best_step) if best_step else "-"
        print("%-24s %10s %10.2f %8s %8s" % (r[0], "%.0f" % r[2] if r[2] else "-", r[3], pr, sr))
EOF
exit $status
