"""PyTorch side of the ViT benchmarks: the timed training loop and failure classification."""

import time

import torch
import torch.nn.functional as F

from common import cpu_peak_bytes, image_side, result, timed


def set_precision(precision: str) -> None:
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


def run(tool: str, mode: str, args, build) -> dict:
    """Builds the model with `build()` on the device, then times Adam steps on random data."""
    dev = torch.device(args.device)
    set_precision(args.precision)
    try:
        torch.manual_seed(0)
        net, fwd = build()
        opt = torch.optim.Adam(net.parameters(), lr=1e-4)
        side = image_side(args.tokens)
        x = torch.randn(args.batch, 1, side, side, dtype=torch.complex64, device=dev)
        y = torch.randint(0, args.classes, (args.batch,), device=dev)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(fwd(x), y)
            loss.backward()
            opt.step()
            return loss

        def sync():
            if dev.type == "cuda":
                torch.cuda.synchronize()

        for _ in range(args.warmup):
            step()
        sync()
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times = []
        loss = None
        for _ in range(args.steps):
            t0 = time.perf_counter()
            loss = step()
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
        peak = torch.cuda.max_memory_allocated() if dev.type == "cuda" else cpu_peak_bytes()
        return result(tool, mode, args, status="ok", peak_bytes=peak, loss=float(loss.detach()), **timed(times))
    except torch.cuda.OutOfMemoryError as e:
        return result(tool, mode, args, status="oom", error=str(e)[:400])
    except Exception as e:  # torch.compile and complex tensors: report whatever it raises
        return result(tool, mode, args, status="error", error=f"{type(e).__name__}: {str(e)[:400]}")
