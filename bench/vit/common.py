"""Shared command line and result line of the ViT benchmarks (no framework imports here).

Every script measures one training step (forward, backward, Adam) of a complex ViT classifier
on random c64 images and prints one JSON line:
  {"tool", "mode", "tokens", "batch", "precision", "layers", "dim", "status", "step_ms",
   "peak_bytes", "error"?}
status is "ok", "oom" (out of memory) or "error" (compile failure or anything else; the
exception text is in "error"). Tokens are (image side / 4)²: 256 tokens ↔ 64×64 images,
1024 ↔ 128×128.
"""

import argparse
import json
import math
import statistics
import sys

PATCH = 4


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--tokens", type=int, default=256, help="patches per image (a square number)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--precision", choices=["fp32", "tf32"], default="fp32")
    p.add_argument("--steps", type=int, default=10, help="timed steps (after --warmup)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cuda", help="cuda or cpu (cpu for smoke tests)")
    # vit_t's shape by default; smaller values for tests on the CPU.
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=3)
    p.add_argument("--dim", type=int, default=192)
    p.add_argument("--mlp", type=int, default=768)
    p.add_argument("--classes", type=int, default=4)
    return p


def image_side(tokens: int) -> int:
    side = math.isqrt(tokens)
    if side * side != tokens:
        sys.exit(f"--tokens {tokens} is not a square number")
    return side * PATCH


def result(tool: str, mode: str, args, **fields) -> dict:
    r = dict(tool=tool, mode=mode, tokens=args.tokens, batch=args.batch, precision=args.precision,
             layers=args.layers, dim=args.dim)
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
