#!/usr/bin/env bash
# What the planner's cheap recomputation (compiler/src/passes/remat.rs, `Options::cheap_remat`)
# costs and saves on the CPU back end: two release builds of cvc, side by side in one run,
# alternating, on copies of the examples with one short epoch and no validation split.
#
# Usage: bench/cpu_remat.sh OLD_CVC NEW_CVC [--reps N]
#   OLD_CVC: a cvc built without the cheap recomputation (e.g. commit 878e7d9),
#   NEW_CVC: one with it. Both run `cvc train FILE --device cpu --epochs 1`.
# Prints one JSON line per run (step_ms = the epoch's step time from metrics.jsonl, planned
# arena, measured peak) and a table of medians last. Scratch files go to bench/out/remat/.
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=$1
NEW=$2
shift 2
REPS=3
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) REPS=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 1 ;;
  esac
done
OUT=bench/out/remat
rm -rf "$OUT"
mkdir -p "$OUT"
# name  example  count  batch
CASES="polsar_unet polsar_unet.cvnn 192 16
complex_resnet complex_resnet.cvnn 384 32
seed_cnn seed_cnn.cvnn 768 64
mri_recon mri_recon.cvnn 160 8
vit_sar vit_sar.cvnn 96 8"
ROWS="$OUT/rows.jsonl"
: >"$ROWS"
while read -r name file count batch; do
  f="$OUT/$name.cvnn"
  sed -e "s/count *= *[0-9]*/count = $count/" -e "s/split *= *[0-9.]*/split     = 1.0/" \
    -e "s/^\( *batch *= *\)[0-9]*/\1$batch/" "examples/$file" >"$f"
  grep -q "split" "$f" || sed -i "s/^\( *batch *=.*\)$/\1\n    split     = 1.0/" "$f"
  for rep in $(seq "$REPS"); do
    for which in old new; do
      bin=$OLD
      [ "$which" = new ] && bin=$NEW
      run="$OUT/run_${name}_${which}_$rep"
      "$bin" train "$f" --device cpu --epochs 1 --out "$run" -q >"$run.log" 2>&1
      python3 - "$name" "$which" "$run/metrics.jsonl" >>"$ROWS" <<'EOF'
import json, sys
name, which, path = sys.argv[1:4]
m = [json.loads(l) for l in open(path)][-1]
print(json.dumps(dict(model=name, build=which, step_ms=m["step_ms"],
                      planned_arena_bytes=m["planned_arena_bytes"],
                      measured_peak_bytes=m["measured_peak_bytes"])))
EOF
      tail -n 1 "$ROWS"
    done
  done
done <<<"$CASES"
python3 - "$ROWS" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
mib = lambda b: b / 2**20
print("\n| model | step ms old | step ms new | step new/old | arena old MiB | arena new MiB | arena new/old | peak old MiB | peak new MiB |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for m in dict.fromkeys(r["model"] for r in rows):
    med = {w: {k: statistics.median(r[k] for r in rows if r["model"] == m and r["build"] == w)
               for k in ("step_ms", "planned_arena_bytes", "measured_peak_bytes")} for w in ("old", "new")}
    o, n = med["old"], med["new"]
    print(f"| {m} | {o['step_ms']:.1f} | {n['step_ms']:.1f} | {n['step_ms'] / o['step_ms']:.3f} | "
          f"{mib(o['planned_arena_bytes']):.1f} | {mib(n['planned_arena_bytes']):.1f} | "
          f"{n['planned_arena_bytes'] / o['planned_arena_bytes']:.3f} | "
          f"{mib(o['measured_peak_bytes']):.1f} | {mib(n['measured_peak_bytes']):.1f} |")
EOF
