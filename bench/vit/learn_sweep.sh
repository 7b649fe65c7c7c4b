#!/usr/bin/env bash
# Learnability sweep of the ViT on synthetic.sar (H200): bench/vit/learn_sar.py on a few data
# settings and recipes at once, one JSON line per epoch, a table of the last epochs at the end.
#   bench/vit/learn_sweep.sh [time-limit-s]
set -uo pipefail
cd "$(dirname "$0")/../.."
T=${1:-400}
CVC=${CVC:-.gpu/cvc}
D=${OUT:-/tmp}/learn
mkdir -p "$D"
$CVC data sar --out /tmp/sar_a.npz --count 8000 --scr-db 15..25 --seed 11 >/dev/null
$CVC data sar --out /tmp/sar_b.npz --count 8000 --scr-db 25..35 --looks 16 --seed 11 >/dev/null
cd bench/vit
python3 learn_sar.py /tmp/sar_a.npz --tag base --time-limit "$T" > "$D/base.jsonl" 2>&1 &
python3 learn_sar.py /tmp/sar_a.npz --tag norm-warm --norm-input --warmup 1 --time-limit "$T" > "$D/norm-warm.jsonl" 2>&1 &
python3 learn_sar.py /tmp/sar_b.npz --tag easy-warm --warmup 1 --time-limit "$T" > "$D/easy-warm.jsonl" 2>&1 &
python3 learn_sar.py /tmp/sar_a.npz --tag norm-lr1e-3 --norm-input --lr 1e-3 --warmup 2 --time-limit "$T" > "$D/norm-lr.jsonl" 2>&1 &
wait
for f in "$D"/*.jsonl; do echo "== $f"; tail -4 "$f"; done
