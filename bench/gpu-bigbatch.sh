#!/usr/bin/env bash
# The seed network at the batch that fills a memory budget (issue 13, scale): `cvc plan
# --max-batch` for examples/seed_cnn.cvnn, then a few training steps at that batch and at
# batch 1024 with `cvc train --device cuda`, and a table of planned vs measured peak and step
# time per sample for both.
#
# Builds nothing: cvc is $CVC_GPU_BIN/cvc (default .gpu/cvc, `cargo build --release`).
# The runs train on synthetic.random data sized to the run (one batch per epoch at the large
# batch, eight at 1024; split = 1, so no validation pass): a copy of the example with its
# train section's data changed, in the log folder. Generating the data is the slow part on
# the host (about 1 ms per 64×64 complex sample on one core), so the large run uses exactly
# one batch of samples and times its last epoch's single step (the first carries the
# first-launch costs).
#
# Usage: bench/gpu-bigbatch.sh [--budget 120GiB] [--epochs N] [--batch N]
#   --batch N skips the search and trains at batch N (e.g. to retry below the offered one).
# Logs go to $OUT (the device tool's output folder) or bench/out, under bigbatch/.
set -u
cd "$(dirname "$0")/.."
BIN=${CVC_GPU_BIN:-.gpu}
LOG=${OUT:-bench/out}/bigbatch
mkdir -p "$LOG"
BUDGET=120GiB EPOCHS=3 BATCH=
while [ $# -gt 0 ]; do
  case "$1" in
    --budget) BUDGET=$2; shift ;;
    --epochs) EPOCHS=$2; shift ;;
    --batch) BATCH=$2; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ -f bench/gpu-env.sh ] && . bench/gpu-env.sh
status=0

echo "== cvc plan examples/seed_cnn.cvnn --max-batch $BUDGET --device cuda =="
"$BIN/cvc" plan examples/seed_cnn.cvnn --max-batch "$BUDGET" --device cuda | tee "$LOG/max-batch.txt"
"$BIN/cvc" plan examples/seed_cnn.cvnn --max-batch "$BUDGET" --device cuda --json >"$LOG/max-batch.json" || status=1
if [ -z "$BATCH" ]; then
  BATCH=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["max_batch"])' "$LOG/max-batch.json") || {
    echo "no batch offered"; exit 1; }
fi
echo "-- the plan at batch $BATCH: kernels by index type --"
"$BIN/cvc" plan examples/seed_cnn.cvnn --batch "$BATCH" --device cuda | tail -3

# run NAME BATCH SAMPLES [FLAGS]: trains a copy of the example on SAMPLES synthetic samples.
# The big run gets the budget too: the batch `--max-batch` offers fits only with the
# recomputation the planner adds under a budget (without it the seed network's arena at
# batch 95,897 is 202 GiB, as the first H200 run found out of memory).
run() {
  local name=$1 batch=$2 count=$3 extra=${4:-}
  local f="$LOG/seed_$name.cvnn"
  sed -e "s/synthetic.random(count = [0-9]*, seed = 1)/synthetic.random(count = $count, seed = 1)/" \
      -e "s/^\(\s*batch\s*=\).*/\1 $batch\n    split     = 1.0/" examples/seed_cnn.cvnn >"$f"
  grep -q "count = $count" "$f" && grep -q "split     = 1.0" "$f" || { echo "could not rewrite the train section"; return 1; }
  echo "== cvc train seed_$name.cvnn --device cuda --batch $batch ($count samples, $EPOCHS epochs) =="
  rm -rf "$LOG/run-$name"
  local t0=$(date +%s)
  "$BIN/cvc" train "$f" --device cuda --epochs "$EPOCHS" --batch "$batch" --out "$LOG/run-$name" \
    --check-numerics off $extra -q >"$LOG/train-$name.log" 2>&1
  local rc=$?
  echo "exit $rc after $(( $(date +%s) - t0 )) s"
  tail -25 "$LOG/train-$name.log"
  return $rc
}

run big "$BATCH" "$BATCH" "--memory-budget $BUDGET" || status=1
run 1024 1024 8192 || status=1

python3 - "$LOG" "$BATCH" <<'EOF' || status=1
import json, os, sys
log, big = sys.argv[1], int(sys.argv[2])
rows = []
for name, batch in (("big", big), ("1024", 1024)):
    path = os.path.join(log, "run-" + name, "metrics.jsonl")
    if not os.path.exists(path):
        print("no metrics for batch %d (%s)" % (batch, path)); continue
    recs = [json.loads(l) for l in open(path) if l.strip() and "step_ms" in l]
    if not recs:
        print("no epochs recorded for batch %d" % batch); continue
    r = recs[-1]  # the last epoch: warm
    rows.append((batch, r["planned_arena_bytes"], r.get("measured_peak_bytes"), r["step_ms"], r["train_loss"]))
gib = lambda b: "%.2f GiB" % (b / 2**30) if b is not None else "-"
print()
print("| batch | planned arena | measured peak | step ms | µs per sample | train loss |")
print("| ---: | ---: | ---: | ---: | ---: | ---: |")
for batch, planned, measured, ms, loss in rows:
    print("| %d | %s | %s | %.1f | %.2f | %.4f |" % (batch, gib(planned), gib(measured), ms, 1e3 * ms / batch, loss))
if len(rows) == 2:
    (b1, _, _, ms1, _), (b2, _, _, ms2, _) = rows
    print("\nper sample, batch %d vs %d: %.2fx the time" % (b1, b2, (ms1 / b1) / (ms2 / b2)))
sys.exit(0 if len(rows) == 2 else 1)
EOF
exit $status
