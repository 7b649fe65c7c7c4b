#!/usr/bin/env bash
# The complex U-Net segmentation benchmark on an NVIDIA GPU: cvc on examples/polsar_unet.cvnn
# against the same network in plain PyTorch native complex (with and without torch.compile)
# and in JAX under jax.jit (bench/unet/), fp32, Adam, per-pixel cross-entropy with
# ignore_index, at a batch size given by flag; then (unless --no-train) the example's own
# training run for its validation pixel accuracy and mIoU. A table is printed last.
#
# Builds nothing: cvc is $CVC_GPU_BIN/cvc (default .gpu/cvc, `cargo build --release`). The
# machine's python3 provides torch and jax (no internet; nothing is installed).
#
# Usage: bench/gpu-unet.sh [--batch N] [--size S] [--steps N] [--no-train] [--no-peers]
#                          [--no-cvc] [--no-compile] [--peer-timeout SECONDS]
#                          [--budget-fraction F] [--budget SIZE] [--no-cvc-plain] [--no-jax]
# --budget-fraction F adds a cvc run under --memory-budget F x the smallest peer peak;
# --budget SIZE one under --memory-budget SIZE; --no-cvc-plain skips cvc's run without one.
# Logs go to $OUT (the device tool's output folder) or bench/out/unet.
set -u
cd "$(dirname "$0")/.."
BIN=${CVC_GPU_BIN:-.gpu}
LOG=${OUT:-bench/out}/unet
mkdir -p "$LOG"
TRAIN=1 PEERS=1 CVC=1 COMPILE=1 JAX=1 STEPS=20 BATCH=32 SIZE=64 PEER_TIMEOUT=1200 BUDGET_FRACTION= BUDGET= PLAIN=1
while [ $# -gt 0 ]; do
  case "$1" in
    --batch) BATCH=$2; shift ;;
    --size) SIZE=$2; shift ;;
    --steps) STEPS=$2; shift ;;
    --no-train) TRAIN=0 ;;
    --no-peers) PEERS=0 ;;
    --no-cvc) CVC=0 ;;
    --no-compile) COMPILE=0 ;;
    --no-jax) JAX=0 ;;
    --peer-timeout) PEER_TIMEOUT=$2; shift ;;
    --budget-fraction) BUDGET_FRACTION=$2; shift ;;
    --budget) BUDGET=$2; shift ;;
    --no-cvc-plain) PLAIN=0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ -f bench/gpu-env.sh ] && . bench/gpu-env.sh
export PYTHONPATH="$PWD/bench/unet${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" 2>&1 | tail -1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
rm -f "$LOG/cvc.jsonl" "$LOG/peers.jsonl"
status=0

# A copy of the example at the benchmark's scene side with one epoch of STEPS + 3 batches
# (the first steps include compilation and warm-up) and no validation split: the peers time
# training steps only, and cvc's validation pass would hold its own inference arena next to
# the training one (the liveness report lists both).
f="$LOG/polsar_unet_${SIZE}.cvnn"
count=$(( (STEPS + 3) * BATCH ))
sed -e "s/c64\[B, 3, 64, 64\]/c64[B, 3, $SIZE, $SIZE]/" \
    -e "s/class\[B, 64, 64\]/class[B, $SIZE, $SIZE]/" \
    -e "s/count = [0-9]*, size = 64/count = $count, size = $SIZE/" -e "s/split *= *[0-9.]*/split     = 1.0/" examples/polsar_unet.cvnn >"$f"
# run_cvc MODE [FLAGS...]: one epoch of the copy through `cvc train --device cuda`, a result line.
run_cvc() {
  local mode=$1; shift
  echo "== cvc train $f --device cuda --epochs 1 --batch $BATCH $* =="
  rm -rf "$LOG/${mode}_run"
  "$BIN/cvc" check "$f" >"$LOG/cvc.check" 2>&1 || { echo "cvc check failed:"; tail -20 "$LOG/cvc.check"; status=1; }
  "$BIN/cvc" plan "$f" --batch "$BATCH" "$@" >"$LOG/$mode.plan" 2>&1 || true
  "$BIN/cvc" train "$f" --device cuda --epochs 1 --batch "$BATCH" --out "$LOG/${mode}_run" -q "$@" >"$LOG/$mode.log" 2>&1
  rc=$?
  tail -5 "$LOG/$mode.log"
  python3 - "$LOG/${mode}_run/metrics.jsonl" "$SIZE" "$BATCH" "$rc" "$LOG/$mode.log" "$LOG/cvc.check" "$mode" >>"$LOG/cvc.jsonl" <<'PY'
import json, re, sys
path, size, b, rc, log, check, mode = sys.argv[1:]
r = dict(tool="cvc", mode=mode, size=int(size), batch=int(b), precision="fp32")
try:
    # `cvc check`'s totals: "parameters: X complex + Y real = Z real scalars (...)".
    m = re.search(r"parameters: .*= ([0-9,]+) real scalars", open(check, errors="replace").read())
    if m:
        r["params"] = int(m.group(1).replace(",", ""))
except OSError:
    pass
try:
    rows = [json.loads(l) for l in open(path) if l.strip() and "step_ms" in l]
    m = rows[-1]
    r.update(status="ok", step_ms=m["step_ms"], peak_bytes=m.get("measured_peak_bytes"),
             samples_per_s=m.get("samples_per_s"), phases=m.get("step_phases_ms"))
except Exception as e:
    tail = open(log, errors="replace").read()[-400:]
    r.update(status="error", error=f"exit {rc}: {tail}")
print(json.dumps(r))
PY
  tail -1 "$LOG/cvc.jsonl"
}
[ "$CVC" = 1 ] && [ "$PLAIN" = 1 ] && run_cvc cvc_unet
[ -n "$BUDGET" ] && run_cvc "cvc_unet_budget_$BUDGET" --memory-budget "$BUDGET"

if [ "$PEERS" = 1 ]; then
  common="--size $SIZE --batch $BATCH --steps $STEPS --precision fp32"
  for peer in "torch_unet.py" "torch_unet.py --compile" "jax_unet.py"; do
    [ "$COMPILE" = 0 ] && [ "$peer" = "torch_unet.py --compile" ] && continue
    [ "$JAX" = 0 ] && [ "$peer" = "jax_unet.py" ] && continue
    echo "== $peer $common =="
    # Each peer in its own process, so one's out-of-memory does not poison the next.
    PYTHONUNBUFFERED=1 timeout "$PEER_TIMEOUT" python3 bench/unet/$peer $common >>"$LOG/peers.jsonl" 2>>"$LOG/peers.err"
    rc=$?
    [ $rc = 124 ] && echo "{\"tool\": \"${peer%%.py*}\", \"mode\": \"$peer\", \"size\": $SIZE, \"batch\": $BATCH, \"precision\": \"fp32\", \"status\": \"error\", \"error\": \"timeout after $PEER_TIMEOUT s\"}" >>"$LOG/peers.jsonl"
    tail -1 "$LOG/peers.jsonl"
  done
fi

if [ "$CVC" = 1 ] && [ -n "$BUDGET_FRACTION" ]; then
  # The same run under a memory budget of BUDGET_FRACTION x the smallest peer peak measured
  # above (the planner recomputes what does not fit).
  mib=$(python3 - "$LOG/peers.jsonl" "$BUDGET_FRACTION" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
peaks = [r["peak_bytes"] for r in rows if r.get("status") == "ok" and r.get("peak_bytes")]
print(int(min(peaks) * float(sys.argv[2]) / 2**20) if peaks else "")
PY
)
  if [ -n "$mib" ]; then run_cvc "cvc_unet_budget_${mib}MiB" --memory-budget "${mib}MiB"; else echo "no peer peak: no budget run"; fi
fi

if [ "$TRAIN" = 1 ]; then
  echo "== cvc train examples/polsar_unet.cvnn --device cuda (its train section) =="
  rm -rf "$LOG/train"
  "$BIN/cvc" train examples/polsar_unet.cvnn --device cuda --out "$LOG/train" -q 2>&1 | tail -15
  python3 - "$LOG/train/metrics.jsonl" <<'PY' || status=1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "train_loss" in r]
for r in rows:
    print("epoch %d  train_loss %.4f  val_acc %s  val_miou %s  step_ms %.3f" % (
        r["epoch"], r["train_loss"], r.get("val_acc"), r.get("val_miou"), r["step_ms"]))
acc = (rows[-1].get("val_acc") or 0) if rows else 0
print("U-Net on synthetic.polsar reaches >= 85%% validation pixel accuracy: %s (%.1f%%)" % ("yes" if acc >= 0.85 else "NO", 100 * acc))
sys.exit(0 if acc >= 0.85 else 1)
PY
fi

python3 - "$LOG" "$SIZE" "$BATCH" <<'PY'
import json, os, sys
log, size, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = []
for f in ("cvc.jsonl", "peers.jsonl"):
    p = os.path.join(log, f)
    if os.path.exists(p):
        for line in open(p):
            line = line.strip()
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass
rows = [r for r in rows if r.get("size") == size and r.get("batch") == batch]
mib = lambda b: "%.0f" % (b / 2**20) if b else "-"
peers = [r for r in rows if r["tool"] != "cvc" and r.get("status") == "ok"]
fast = min((r["step_ms"] for r in peers), default=None)
small = min((r["peak_bytes"] for r in peers if r.get("peak_bytes")), default=None)
print("\nU-Net, %dx%d scenes, batch %d, fp32: ratios to the fastest peer step (%s ms) and smallest peer peak (%s MiB)" % (
    size, size, batch, "%.2f" % fast if fast else "n/a", mib(small)))
print("%-28s %-7s %10s %10s %8s %8s %8s  %s" % ("mode", "status", "step ms", "peak MiB", "step x", "peak x", "params", "error"))
for r in rows:
    ok = r.get("status") == "ok"
    sx = "%.2f" % (r["step_ms"] / fast) if ok and fast else "-"
    px = "%.2f" % (r["peak_bytes"] / small) if ok and small and r.get("peak_bytes") else "-"
    print("%-28s %-7s %10s %10s %8s %8s %8s  %s" % (r["mode"], r.get("status"), "%.2f" % r["step_ms"] if ok else "-",
          mib(r.get("peak_bytes")) if ok else "-", sx, px, r.get("params", "-"), (r.get("error") or "")[:90].replace("\n", " ")))
PY
exit $status
