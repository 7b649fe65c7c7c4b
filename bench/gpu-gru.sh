#!/usr/bin/env bash
# The complex GRU benchmark on an NVIDIA GPU: cvc on examples/rf_gru.cvnn (fused recurrence,
# one persistent kernel per direction and pass) against the same network in PyTorch with
# complextorch's GRU (bench/rnn/torch_gru.py: the cell rolled along time in Python, eager and
# torch.compile), fp32, Adam, at the sizes given by flags; a table is printed last.
#
# Builds nothing: cvc is $CVC_GPU_BIN/cvc (default .gpu/cvc, `cargo build --release`). The
# machine's python3 provides torch; complextorch comes from bench/rnn/wheels.
#
# Usage: bench/gpu-gru.sh [--batch N] [--length L] [--hidden H] [--steps N] [--no-compile]
#                         [--no-peers] [--peer-timeout SECONDS] [--budget SIZE]
# --budget adds a cvc run under `--memory-budget SIZE` (chunked back-propagation through time
# when the plan needs it). Logs go to $OUT/gru (the device tool's output folder) or bench/out/gru.
set -u
cd "$(dirname "$0")/.."
BIN=${CVC_GPU_BIN:-.gpu}
LOG=${OUT:-bench/out}/gru
mkdir -p "$LOG"
PEERS=1 COMPILE=1 STEPS=20 BATCH=128 LENGTH=4096 HIDDEN=32 PEER_TIMEOUT=600 BUDGET=
while [ $# -gt 0 ]; do
  case "$1" in
    --batch) BATCH=$2; shift ;;
    --length) LENGTH=$2; shift ;;
    --hidden) HIDDEN=$2; shift ;;
    --steps) STEPS=$2; shift ;;
    --no-peers) PEERS=0 ;;
    --no-compile) COMPILE=0 ;;
    --peer-timeout) PEER_TIMEOUT=$2; shift ;;
    --budget) BUDGET=$2; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ -f bench/gpu-env.sh ] && . bench/gpu-env.sh
tag="b${BATCH}_l${LENGTH}_h${HIDDEN}"
rm -f "$LOG/rows_$tag.jsonl"

# A copy of the example at the benchmark's sizes with one epoch of STEPS + 3 batches (the
# first steps include compilation and warm-up) and no validation split: the peers time training
# steps only, and cvc's validation pass would hold its own inference arena next to the
# training one (the liveness report lists both).
f="$LOG/rf_gru_$tag.cvnn"
count=$(( (STEPS + 3) * BATCH ))
sed -e "s/c64\[B, 1, 512\]/c64[B, 1, $LENGTH]/" -e "s/length = 512/length = $LENGTH/" \
    -e "s/count = [0-9]*/count = $count/" -e "s/gru(16/gru($HIDDEN/" -e "s/split *= *[0-9.]*/split     = 1.0/" examples/rf_gru.cvnn >"$f"
"$BIN/cvc" check "$f" >"$LOG/cvc_$tag.check" 2>&1 || { echo "cvc check failed:"; cat "$LOG/cvc_$tag.check"; }
run_cvc() {  # name, extra flags...
  local name=$1; shift
  echo "== cvc train $f --device cuda --epochs 1 --batch $BATCH $* =="
  rm -rf "$LOG/run_${name}_$tag"
  "$BIN/cvc" plan "$f" --batch "$BATCH" "$@" >"$LOG/plan_${name}_$tag.txt" 2>&1
  "$BIN/cvc" train "$f" --device cuda --epochs 1 --batch "$BATCH" --out "$LOG/run_${name}_$tag" -q "$@" >"$LOG/train_${name}_$tag.log" 2>&1
  local rc=$?
  tail -3 "$LOG/train_${name}_$tag.log"
  python3 - "$LOG/run_${name}_$tag/metrics.jsonl" "$name" "$BATCH" "$LENGTH" "$HIDDEN" "$rc" "$LOG/train_${name}_$tag.log" "$LOG/cvc_$tag.check" >>"$LOG/rows_$tag.jsonl" <<'PY'
import json, re, sys
path, name, b, length, hidden, rc, log, check = sys.argv[1:]
r = dict(tool="cvc", mode=name, batch=int(b), length=int(length), steps=int(length) // 8, hidden=int(hidden), precision="fp32")
m = re.search(r"parameters: .*= ([0-9,]+) real scalars", open(check, errors="replace").read())
if m:
    r["params"] = int(m.group(1).replace(",", ""))
try:
    rows = [json.loads(l) for l in open(path) if l.strip() and "step_ms" in l]
    r.update(status="ok", step_ms=rows[-1]["step_ms"], peak_bytes=rows[-1].get("measured_peak_bytes"))
except Exception:
    r.update(status="error", error="exit %s: %s" % (rc, open(log, errors="replace").read()[-400:]))
print(json.dumps(r))
PY
  tail -1 "$LOG/rows_$tag.jsonl"
}
run_cvc cvc
[ -n "$BUDGET" ] && run_cvc "cvc_budget_$BUDGET" --memory-budget "$BUDGET"

if [ "$PEERS" = 1 ]; then
  for flag in "" "--compile"; do
    [ "$COMPILE" = 0 ] && [ -n "$flag" ] && continue
    echo "== bench/rnn/torch_gru.py --batch $BATCH --length $LENGTH --hidden $HIDDEN $flag =="
    PYTHONUNBUFFERED=1 timeout "$PEER_TIMEOUT" python3 bench/rnn/torch_gru.py --batch "$BATCH" --length "$LENGTH" \
      --hidden "$HIDDEN" --steps "$STEPS" $flag >>"$LOG/rows_$tag.jsonl" 2>>"$LOG/peers.err"
    [ $? = 124 ] && echo "{\"tool\": \"pytorch\", \"mode\": \"complextorch_gru${flag:+_compile}\", \"batch\": $BATCH, \"length\": $LENGTH, \"hidden\": $HIDDEN, \"status\": \"error\", \"error\": \"timeout after $PEER_TIMEOUT s\"}" >>"$LOG/rows_$tag.jsonl"
    tail -1 "$LOG/rows_$tag.jsonl"
  done
fi

python3 - "$LOG/rows_$tag.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
mib = lambda b: "%.1f" % (b / 2**20) if b else "-"
peers = [r for r in rows if r["tool"] != "cvc" and r.get("status") == "ok"]
fast = min((r["step_ms"] for r in peers), default=None)
small = min((r["peak_bytes"] for r in peers if r.get("peak_bytes")), default=None)
r0 = rows[0] if rows else {}
print("\nGRU classifier, batch %s, %s IQ samples = %s steps, hidden %s, fp32: ratios to the fastest peer step (%s ms) and smallest peer peak (%s MiB)" % (
    r0.get("batch"), r0.get("length"), r0.get("steps"), r0.get("hidden"), "%.2f" % fast if fast else "n/a", mib(small)))
print("%-26s %-7s %10s %10s %8s %8s %8s  %s" % ("mode", "status", "step ms", "peak MiB", "step x", "peak x", "params", "error"))
for r in rows:
    ok = r.get("status") == "ok"
    sx = "%.3f" % (r["step_ms"] / fast) if ok and fast else "-"
    px = "%.3f" % (r["peak_bytes"] / small) if ok and small and r.get("peak_bytes") else "-"
    print("%-26s %-7s %10s %10s %8s %8s %8s  %s" % (r["mode"], r.get("status"), "%.2f" % r["step_ms"] if ok else "-",
          mib(r.get("peak_bytes")) if ok else "-", sx, px, r.get("params", "-"), (r.get("error") or "")[:90].replace("\n", " ")))
PY
