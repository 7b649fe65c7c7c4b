#!/usr/bin/env python3
"""Achieved bandwidth per kernel kind: joins a GPU profile (the `bench_seed_cnn` stderr of
`CVC_BENCH_PROFILE=...`, one `  0.187 ms  k922_ew ...` line per launch, kernels run one at a
time) with the plan's bytes (`cvc plan FILE --batch N --json --device cuda`: each kernel's
`group`, `read_bytes`, `written_bytes`; the back end's list maps kernel names to groups).

    cvc plan examples/vit_sar.cvnn --batch 128 --json --device cuda > plan.json
    python3 bench/plan_bandwidth.py plan.json bench-vit_sar-fp32-default.err [TOP]

Prints, per kind: launches, time, bytes moved (at the plan's storage widths; values read
twice in one launch count once), the bandwidth that implies, the launches under 1 MB and
their time, then the TOP slowest launches of each kind."""
import json
import re
import sys

plan = json.load(open(sys.argv[1]))
top = int(sys.argv[3]) if len(sys.argv) > 3 else 5
by_group = {k["group"]: k for k in plan["kernels"]}
name_group = {b["name"]: b["group"] for b in plan["backend"]["kernels"]}
if not name_group:
    sys.exit("the plan lists no CUDA kernels: run `cvc plan ... --json --device cuda`")
times = {}
for line in open(sys.argv[2]):
    m = re.match(r"\s+([0-9.]+) ms\s+(k\d+_\w+)", line)
    if m:
        times[m.group(2)] = float(m.group(1))
rows = []
for name, ms in times.items():
    if name not in name_group:
        sys.exit(f"{name} is not in the plan's kernels: plan and profile are of different builds or batches")
    k = by_group[name_group[name]]
    moved = k["read_bytes"] + k["written_bytes"]
    rows.append(dict(kind=k["kind"], name=name, ms=ms, bytes=moved, label=k["label"][:64], domain=k["domain"]))
print("%-12s %8s %10s %10s %10s %16s" % ("kind", "launches", "ms", "GB moved", "GB/s", "under 1 MB"))
kinds = sorted({r["kind"] for r in rows}, key=lambda k: -sum(r["ms"] for r in rows if r["kind"] == k))
for kind in kinds:
    r = [x for x in rows if x["kind"] == kind]
    ms = sum(x["ms"] for x in r)
    gb = sum(x["bytes"] for x in r) / 1e9
    small = [x for x in r if x["bytes"] < 1e6]
    print("%-12s %8d %10.2f %10.1f %10.0f %6d, %6.2f ms" % (kind, len(r), ms, gb, gb / ms * 1e3, len(small),
                                                          sum(x["ms"] for x in small)))
for kind in kinds:
    print(f"\n{kind}, slowest:")
    for x in sorted((x for x in rows if x["kind"] == kind), key=lambda x: -x["ms"])[:top]:
        print("  %7.3f ms %6.0f GB/s  %-10s %s %s" % (x["ms"], x["bytes"] / x["ms"] / 1e6, x["name"], x["label"], x["domain"]))
