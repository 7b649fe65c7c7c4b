"""Shared command line and result line of the U-Net benchmarks (no framework imports here).

Every script measures one training step (forward, backward, Adam) of the complex U-Net of
examples/polsar_unet.cvnn on random c64 scenes `[B, 3, S, S]` with per-pixel labels (10% of
them the ignore label -100) and prints one JSON line, the line format of bench/vit:
  {"tool", "mode", "size", "batch", "precision", "width", "classes", "status", "step_ms",
   "step_ms_min", "peak_bytes", "params", "error"?}
status is "ok", "oom" (out of memory) or "error" (compile failure or anything else; the
exception text is in "error"). `params` is the number of real trainable parameters (a complex
one counts 2), to compare with `cvc plan`.
"""

import argparse
import json
import statistics

IGNORE = -100
LEVELS = 4


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--size", type=int, default=64, help="scene side (a multiple of 8)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--precision", choices=["fp32", "tf32"], default="fp32")
    p.add_argument("--steps", type=int, default=10, help="timed steps (after --warmup)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cuda", help="cuda or cpu (cpu for smoke tests)")
    # examples/polsar_unet.cvnn's shape by default: widths w, 2w, 4w, 8w over four levels.
    p.add_argument("--width", type=int, default=8, help="channels of the first level")
    p.add_argument("--classes", type=int, default=5)
    p.add_argument("--channels", type=int, default=3, help="input channels (HH, HV, VV)")
    return p


def widths(width: int):
    return [width * 2 ** i for i in range(LEVELS)]


def check_size(size: int) -> None:
    if size % 2 ** (LEVELS - 1):
        raise SystemExit(f"--size {size} is not a multiple of {2 ** (LEVELS - 1)}")


def result(tool: str, mode: str, args, **fields) -> dict:
    r = dict(tool=tool, mode=mode, size=args.size, batch=args.batch, precision=args.precision,
             width=args.width, classes=args.classes)
    r.update(fields)
    return r


def timed(times_ms):
    return dict(step_ms=statistics.median(times_ms), step_ms_min=min(times_ms))


def emit(r: dict) -> None:
    print(json.dumps(r), flush=True)


def cpu_peak_bytes() -> int:
    """Peak resident memory of this process (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
