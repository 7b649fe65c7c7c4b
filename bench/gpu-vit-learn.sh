#!/usr/bin/env bash
# Does examples/vit_sar.cvnn learn synthetic.sar? A short run of its train section on the GPU
# (epochs and precision from the arguments), printing the per-epoch metrics.
# Usage: bench/gpu-vit-learn.sh [EPOCHS] [PRECISION]
set -u
cd "$(dirname "$0")/.."
BIN=${CVC_GPU_BIN:-.gpu}
LOG=${OUT:-bench/out}
mkdir -p "$LOG"
. bench/gpu-env.sh
rm -rf "$LOG/vit-learn"
"$BIN/cvc" train examples/vit_sar.cvnn --device cuda --epochs "${1:-6}" --precision "${2:-tf32}" --out "$LOG/vit-learn" 2>&1 | grep -v "^\s*$" | tail -12
python3 - "$LOG/vit-learn/metrics.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    m = json.loads(l)
    print("epoch %d  train loss %.4f acc %.3f  val loss %.4f acc %.3f  %.1f ms/step" % (
        m["epoch"], m["train_loss"], m.get("train_acc") or 0, m.get("val_loss") or 0, m.get("val_acc") or 0, m["step_ms"]))
PY
