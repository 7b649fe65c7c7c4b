"""The complex GRU classifier of examples/rf_gru.cvnn in PyTorch with complextorch; one JSON line.

    python3 bench/rnn/torch_gru.py --batch 128 --length 4096 --hidden 32 [--compile]

The network, layer for layer as the example: complextorch's `Conv1d(1, 8, 8, stride=8)` (a
native complex torch.nn.Conv1d), complextorch's `BatchNorm1d` (2×2 whitening, cvc's
`batchnorm(kind = whitening)`), the time axis moved to axis 1, complextorch's `GRU` (its
`GRUCell`: six complex `Linear`s, split sigmoid/tanh, rolled along time in Python — the
library's own note says it cannot use the real-only cuDNN kernel), the last state, a complex
`Linear` to the classes, |·| as logits, cross-entropy, Adam. fp32. `--compile` wraps the model
in torch.compile.

complextorch is imported from the wheel in bench/rnn/wheels when it is not installed (it is
pure Python: the wheel goes on sys.path as it is). The result line has the fields of
bench/unet/common.py with `length` (IQ samples), `steps` (GRU time steps) and `hidden`.
"""

import argparse
import glob
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import complextorch  # noqa: F401
except ImportError:
    sys.path[:0] = sorted(glob.glob(os.path.join(HERE, "wheels", "complextorch-*.whl")))

import torch
import torch.nn.functional as F
from complextorch.nn.modules.batchnorm import BatchNorm1d
from complextorch.nn.modules.conv import Conv1d
from complextorch.nn.modules.linear import Linear
from complextorch.nn.modules.rnn import GRU
from torch import nn

FEATURES = 8  # conv1d(8, kernel = 8, stride = 8): 8 channels, one step per 8 samples


class RfGru(nn.Module):
    def __init__(self, hidden: int, classes: int):
        super().__init__()
        self.conv = Conv1d(1, FEATURES, FEATURES, stride=FEATURES)
        self.norm = BatchNorm1d(FEATURES)
        self.gru = GRU(FEATURES, hidden, batch_first=True)
        self.head = Linear(hidden, classes)

    def forward(self, iq):
        steps = self.norm(self.conv(iq)).transpose(1, 2)  # [B, T, 8]
        _, h_n = self.gru(steps)
        return self.head(h_n[-1]).abs()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--length", type=int, default=4096, help="IQ samples per burst (a multiple of 8)")
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--classes", type=int, default=5)
    p.add_argument("--steps", type=int, default=10, help="timed training steps (after --warmup)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", default="cuda")
    p.add_argument("--compile", action="store_true")
    args = p.parse_args()
    mode = "complextorch_gru" + ("_compile" if args.compile else "")
    r = dict(tool="pytorch", mode=mode, batch=args.batch, length=args.length, steps=args.length // FEATURES,
             hidden=args.hidden, precision="fp32")
    dev = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        torch.manual_seed(0)
        net = RfGru(args.hidden, args.classes).to(dev)
        r["params"] = sum(q.numel() * (2 if q.is_complex() else 1) for q in net.parameters())
        fwd = torch.compile(net) if args.compile else net
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        x = torch.randn(args.batch, 1, args.length, dtype=torch.complex64, device=dev)
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
        for _ in range(args.steps):
            t0 = time.perf_counter()
            loss = step()
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
        if dev.type == "cuda":
            r["peak_bytes"] = torch.cuda.max_memory_allocated()
        r.update(status="ok", step_ms=statistics.median(times), step_ms_min=min(times), loss=float(loss.detach()),
                 torch=torch.__version__)
    except torch.cuda.OutOfMemoryError as e:
        r.update(status="oom", error=str(e)[:400])
    except Exception as e:  # torch.compile on complex tensors: report whatever it raises
        r.update(status="error", error=f"{type(e).__name__}: {str(e)[:400]}")
    print(json.dumps(r), flush=True)
    return 0 if r["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
