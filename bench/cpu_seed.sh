#!/usr/bin/env bash
# CPU benchmark of the seed network (examples/seed_cnn.cvnn) at batch 64 on 2 threads:
# cvc (release build) vs PyTorch CPU (the variants of bench/seed_cpu_torch.py) vs JAX CPU
# (bench/jax_seed_cpu.py), each in its own process pinned to the same 2 cores, then a table
# of median step time and peak RSS with the ratios the issue sets as targets
# (cvc step ≤ 1.0× the fastest peer, cvc peak RSS ≤ 0.5× the smallest peer).
#
# Usage: bench/cpu_seed.sh [--batch N] [--steps N] [--skip-python] [--no-compile]
# PyTorch and JAX are installed with pip into bench/.venv on first use (needs PyPI).
# Raw JSON lines go to bench/out/ (created); the table is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
BATCH=64
STEPS=20
SKIP_PY=0
COMPILE=1
while [ $# -gt 0 ]; do
  case "$1" in
    --batch) BATCH="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    --skip-python) SKIP_PY=1; shift ;;
    --no-compile) COMPILE=0; shift ;;
    *) echo "unknown option $1" >&2; exit 1 ;;
  esac
done
OUT=bench/out
mkdir -p "$OUT"
: > "$OUT/results.jsonl"
PIN=""
if command -v taskset > /dev/null && [ "$(nproc --all)" -ge 2 ]; then PIN="taskset -c 0,1"; fi
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores visible, pinned: ${PIN:-no}"

# --- cvc ---------------------------------------------------------------------------------
cargo build --release -p cvc-runtime --quiet
CVC=target/release/cvc
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# Same network; a data set just large enough for STEPS training steps of one epoch (the
# default split keeps 10% for validation), so the data set adds little to the peak RSS.
COUNT=$(( (BATCH * STEPS * 10 + 8) / 9 + BATCH ))
sed -E "s/synthetic\.random\(count = [0-9]+/synthetic.random(count = $COUNT/" examples/seed_cnn.cvnn > "$WORK/seed_cnn.cvnn"
echo "cvc: $CVC train seed_cnn.cvnn --device cpu --epochs 1 --batch $BATCH (data count $COUNT)"
CVC_THREADS=2 $PIN "$CVC" train "$WORK/seed_cnn.cvnn" --device cpu --epochs 1 --batch "$BATCH" --quiet --out "$WORK/run"
python3 - "$WORK/run/metrics.jsonl" "$BATCH" >> "$OUT/results.jsonl" <<'PY'
import json, sys
m = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][-1]
print(json.dumps(dict(tool="cvc", mode="cvc_cpu", batch=int(sys.argv[2]), step_ms=m["step_ms"],
                      peak_mib=(m.get("measured_peak_bytes") or 0) / 2**20,
                      planned_arena_mib=m["planned_arena_bytes"] / 2**20)))
PY
tail -1 "$OUT/results.jsonl"

# --- PyTorch and JAX ---------------------------------------------------------------------
if [ "$SKIP_PY" = 0 ]; then
  VENV=bench/.venv
  if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip
    "$VENV/bin/pip" install --quiet torch jax
  fi
  PY="$VENV/bin/python"
  for v in split_complex split_cast native; do
    runs="--no-compile"
    [ "$COMPILE" = 1 ] && runs="--no-compile --compile-only"
    for r in $runs; do
      echo "pytorch: $v $r"
      $PIN "$PY" bench/seed_cpu_torch.py --device cpu --threads 2 --batch "$BATCH" --steps "$STEPS" \
        --variants "$v" "$r" 2>"$OUT/torch_${v}${r}.err" | grep '^{' \
        | sed 's/^{/{"tool": "pytorch", /' | tee -a "$OUT/results.jsonl" || true
    done
  done
  for fp in "" "--fp32"; do
    echo "jax: jit $fp"
    $PIN "$PY" bench/jax_seed_cpu.py --batch "$BATCH" $fp 2>"$OUT/jax${fp}.err" | grep '^{' \
      | sed 's/^{/{"tool": "jax", /' | tee -a "$OUT/results.jsonl" || true
  done
fi

# --- table -------------------------------------------------------------------------------
python3 - "$OUT/results.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ok = [r for r in rows if "error" not in r and r.get("step_ms")]
print("\n%-8s %-26s %6s %10s %10s" % ("tool", "variant", "batch", "step ms", "peak MiB"))
for r in rows:
    if "error" in r:
        print("%-8s %-26s %6s  ERROR %s" % (r["tool"], r["mode"], r.get("batch", ""), r["error"][:60]))
    else:
        print("%-8s %-26s %6d %10.1f %10.1f" % (r["tool"], r["mode"], r["batch"], r["step_ms"], r["peak_mib"]))
cvc = next((r for r in ok if r["tool"] == "cvc"), None)
peers = [r for r in ok if r["tool"] != "cvc"]
if cvc and peers:
    fast = min(peers, key=lambda r: r["step_ms"]); small = min(peers, key=lambda r: r["peak_mib"])
    print("\ncvc step / fastest peer (%s %s): %.2fx  (target <= 1.0)" % (fast["tool"], fast["mode"], cvc["step_ms"] / fast["step_ms"]))
    print("cvc peak / smallest peer (%s %s): %.2fx  (target <= 0.5)" % (small["tool"], small["mode"], cvc["peak_mib"] / small["peak_mib"]))
PY
