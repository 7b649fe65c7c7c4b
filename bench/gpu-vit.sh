#!/usr/bin/env bash
# The complex ViT benchmark on an NVIDIA GPU (issue 11): cvc on examples/vit_sar.cvnn against
# torchcvnn 0.10's own vit_t, a plain PyTorch native-complex ViT (with and without
# torch.compile) and a JAX version under jax.jit, at (256 tokens, batch 128) and (1024 tokens
# from 128×128 images, batch 32), fp32 and tf32; then (unless --no-train) the example's own
# training run for its validation accuracy. A table is printed last.
#
# Builds nothing: cvc is $CVC_GPU_BIN/cvc (default .gpu/cvc, `cargo build --release`); the
# torchcvnn and complextorch wheels are installed with `pip --target` from
# $CVC_GPU_BIN/wheels or, failing that, from bench/vit/wheels (copies kept in the repo).
# The machine's python3 provides torch and jax.
#
# Usage: bench/gpu-vit.sh [--no-train] [--no-peers] [--no-cvc] [--steps N]
#                         [--precisions "fp32 tf32"] [--peer-timeout SECONDS]
# Logs go to $OUT (the device tool's output folder) or bench/out/vit.
set -u
cd "$(dirname "$0")/.."
BIN=${CVC_GPU_BIN:-.gpu}
LOG=${OUT:-bench/out}/vit
mkdir -p "$LOG"
TRAIN=1 PEERS=1 CVC=1 STEPS=10 PRECS="fp32 tf32" PEER_TIMEOUT=1200
while [ $# -gt 0 ]; do
  case "$1" in
    --no-train) TRAIN=0 ;;
    --no-peers) PEERS=0 ;;
    --no-cvc) CVC=0 ;;
    --steps) STEPS=$2; shift ;;
    --precisions) PRECS=$2; shift ;;
    --peer-timeout) PEER_TIMEOUT=$2; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ -f bench/gpu-env.sh ] && . bench/gpu-env.sh

SITE=${TMPDIR:-/tmp}/cvc-vit-site
rm -rf "$SITE"
WHEELS=$(ls "$BIN"/wheels/torchcvnn-*.whl "$BIN"/wheels/complextorch-*.whl 2>/dev/null)
[ -n "$WHEELS" ] || WHEELS=$(ls bench/vit/wheels/*.whl)
python3 -m pip install -q --no-index --no-deps --target "$SITE" $WHEELS 2>/dev/null ||
  python3 -m pip install -q --no-index --no-deps --break-system-packages --target "$SITE" $WHEELS
export PYTHONPATH="$SITE:$PWD/bench/vit${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import torch, torchcvnn, complextorch; print('torch', torch.__version__, 'torchcvnn', torchcvnn.__version__ if hasattr(torchcvnn, '__version__') else '0.10', 'cuda', torch.cuda.is_available())"
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" 2>&1 | tail -1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null

status=0
SHAPES="256:128 1024:32"

# A copy of the example for one benchmark point: image side, positions and token count for
# the token count, one epoch of `count` images, the precision in the train section.
variant() { # tokens precision count -> path
  local t=$1 prec=$2 count=$3 side
  side=$(python3 -c "import math; print(4 * math.isqrt($t))")
  local f="$LOG/vit_sar_${t}_${prec}.cvnn"
  sed -e "s/c64\[B, 1, 64, 64\]/c64[B, 1, $side, $side]/" \
      -e "s/c64\[1, 256, 192\]/c64[1, $t, 192]/" \
      -e "s/reshape(B, 192, 256)/reshape(B, 192, $t)/" \
      -e "s/count = [0-9]*, size = 64/count = $count, size = $side/" \
      -e "s/^    seed      = 1$/    precision = $prec\n    seed      = 1/" examples/vit_sar.cvnn >"$f"
  echo "$f"
}

if [ "$CVC" = 1 ]; then
  for prec in $PRECS; do
    for s in $SHAPES; do
      t=${s%%:*} b=${s##*:}
      # STEPS + 3 steps of one epoch (the first steps include compilation and warm-up).
      f=$(variant "$t" "$prec" $(( (STEPS + 3) * b * 10 / 9 + b )))
      echo "== cvc train $f --device cuda --epochs 1 --batch $b =="
      rm -rf "$LOG/cvc_${t}_${prec}"
      "$BIN/cvc" check "$f" >"$LOG/cvc_${t}_${prec}.check" 2>&1 || { echo "cvc check failed:"; tail -20 "$LOG/cvc_${t}_${prec}.check"; status=1; continue; }
      "$BIN/cvc" plan "$f" --batch "$b" >"$LOG/cvc_${t}_${prec}.plan" 2>&1 || true
      "$BIN/cvc" train "$f" --device cuda --epochs 1 --batch "$b" --out "$LOG/cvc_${t}_${prec}" -q >"$LOG/cvc_${t}_${prec}.log" 2>&1
      rc=$?
      tail -5 "$LOG/cvc_${t}_${prec}.log"
      python3 - "$LOG/cvc_${t}_${prec}/metrics.jsonl" "$t" "$b" "$prec" "$rc" "$LOG/cvc_${t}_${prec}.log" >>"$LOG/cvc.jsonl" <<'PY'
import json, sys
path, t, b, prec, rc, log = sys.argv[1:]
r = dict(tool="cvc", mode="cvc_vit", tokens=int(t), batch=int(b), precision=prec)
try:
    rows = [json.loads(l) for l in open(path) if l.strip() and "step_ms" in l]
    m = rows[-1]
    r.update(status="ok", step_ms=m["step_ms"], peak_bytes=m.get("measured_peak_bytes"))
except Exception as e:
    tail = open(log, errors="replace").read()[-400:]
    r.update(status="error", error=f"exit {rc}: {tail}")
print(json.dumps(r))
PY
      tail -1 "$LOG/cvc.jsonl"
    done
  done
fi

if [ "$PEERS" = 1 ]; then
  for prec in $PRECS; do
    for s in $SHAPES; do
      t=${s%%:*} b=${s##*:}
      common="--tokens $t --batch $b --precision $prec --steps $STEPS"
      for peer in "torchcvnn_vit.py" "torch_vit.py" "torch_vit.py --compile" "jax_vit.py"; do
        echo "== $peer $common =="
        # Each peer in its own process, so one's out-of-memory does not poison the next.
        PYTHONUNBUFFERED=1 timeout "$PEER_TIMEOUT" python3 bench/vit/$peer $common >>"$LOG/peers.jsonl" 2>>"$LOG/peers.err"
        rc=$?
        [ $rc = 124 ] && echo "{\"tool\": \"${peer%%.py*}\", \"mode\": \"$peer\", \"tokens\": $t, \"batch\": $b, \"precision\": \"$prec\", \"status\": \"error\", \"error\": \"timeout after $PEER_TIMEOUT s\"}" >>"$LOG/peers.jsonl"
        tail -1 "$LOG/peers.jsonl"
      done
    done
  done
fi

if [ "$TRAIN" = 1 ]; then
  echo "== cvc train examples/vit_sar.cvnn --device cuda (its train section) =="
  rm -rf "$LOG/train"
  "$BIN/cvc" train examples/vit_sar.cvnn --device cuda --out "$LOG/train" -q 2>&1 | tail -15
  python3 - "$LOG/train/metrics.jsonl" <<'PY' || status=1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "train_loss" in r]
for r in rows:
    print("epoch %d  train_loss %.4f  val_acc %s  step_ms %.3f  peak %s" % (r["epoch"], r["train_loss"], r.get("val_acc"), r["step_ms"], r.get("measured_peak_bytes")))
acc = rows[-1].get("val_acc") or 0 if rows else 0
print("ViT on synthetic.sar reaches >= 90%% validation accuracy: %s (%.1f%%)" % ("yes" if acc >= 0.9 else "NO", 100 * acc))
sys.exit(0 if acc >= 0.9 else 1)
PY
fi

python3 - "$LOG" <<'PY'
import glob, json, os, sys
rows = []
for f in ("cvc.jsonl", "peers.jsonl"):
    p = os.path.join(sys.argv[1], f)
    if os.path.exists(p):
        for line in open(p):
            line = line.strip()
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass
mib = lambda b: "%.0f" % (b / 2**20) if b else "-"
for prec in ("fp32", "tf32"):
    for t, b in ((256, 128), (1024, 32)):
        rs = [r for r in rows if r.get("precision") == prec and r.get("tokens") == t and r.get("batch") == b]
        if not rs:
            continue
        peers = [r for r in rs if r["tool"] != "cvc" and r.get("status") == "ok"]
        fast = min((r["step_ms"] for r in peers), default=None)
        small = min((r["peak_bytes"] for r in peers if r.get("peak_bytes")), default=None)
        print("\nViT, %d tokens, batch %d, %s: ratios to the fastest peer step (%s ms) and smallest peer peak (%s MiB)" % (
            t, b, prec, "%.1f" % fast if fast else "n/a", mib(small)))
        print("%-22s %-7s %10s %10s %8s %8s  %s" % ("mode", "status", "step ms", "peak MiB", "step x", "peak x", "error"))
        for r in rs:
            ok = r.get("status") == "ok"
            sx = "%.2f" % (r["step_ms"] / fast) if ok and fast else "-"
            px = "%.2f" % (r["peak_bytes"] / small) if ok and small and r.get("peak_bytes") else "-"
            print("%-22s %-7s %10s %10s %8s %8s  %s" % (r["mode"], r.get("status"), "%.1f" % r["step_ms"] if ok else "-",
                  mib(r.get("peak_bytes")) if ok else "-", sx, px, (r.get("error") or "")[:90].replace("\n", " ")))
cvc = {(r["tokens"], r["precision"]): r for r in rows if r["tool"] == "cvc" and r.get("status") == "ok" and r.get("peak_bytes")}
for prec in ("fp32", "tf32"):
    a, b = cvc.get((256, prec)), cvc.get((1024, prec))
    if a and b:
        pa, pb = a["peak_bytes"] / (a["batch"] * 256), b["peak_bytes"] / (b["batch"] * 1024)
        print("\ncvc %s peak per (sample x token): %.0f B at 256 tokens, %.0f B at 1024: ratio %.2f (target <= 1.2)" % (prec, pa, pb, pb / pa))
PY
exit $status
