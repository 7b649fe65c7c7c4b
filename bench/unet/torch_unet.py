"""The complex U-Net of examples/polsar_unet.cvnn in PyTorch native complex; one JSON line.

    python3 bench/unet/torch_unet.py --batch 16 [--compile] [--size 64 --width 8]

complex64 tensors and torch.nn's complex Conv2d: four levels of two 3×3 convolutions (pad 1,
bias), each followed by cvc's `batchnorm(kind = naive)` (BatchNorm2d on the real and on the
imaginary part, each with its own affine) and CReLU; 2×2 max-magnitude pooling down, nearest
2× upsampling up, the skip joined before the upsampled path on the channel axis; a 1×1
convolution to the classes, |·| as logits, per-pixel cross-entropy with ignore_index = -100,
Adam. `--compile` wraps the model in torch.compile. fp32 by default.
"""

import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from common import IGNORE, check_size, cpu_peak_bytes, emit, parser, result, timed, widths

C64 = torch.complex64


class NaiveBatchNorm(nn.Module):
    """cvc's batchnorm(kind = naive): real and imaginary parts normalised separately."""

    def __init__(self, c: int):
        super().__init__()
        self.re = nn.BatchNorm2d(c)
        self.im = nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.complex(self.re(x.real), self.im(x.imag))


def crelu(x):
    return torch.complex(F.relu(x.real), F.relu(x.imag))


def maxpool_magnitude(x):
    """2×2 max pooling that keeps the element of largest |x| (cvc's complex maxpool2d)."""
    _, idx = F.max_pool2d(x.abs(), 2, return_indices=True)
    b, c, h, w = x.shape
    flat = x.reshape(b, c, h * w)
    return flat.gather(2, idx.reshape(b, c, -1)).reshape(idx.shape)


def upsample(x):
    return x.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3)


class Stage(nn.Module):
    def __init__(self, cin: int, c: int):
        super().__init__()
        self.c1 = nn.Conv2d(cin, c, 3, padding=1, dtype=C64)
        self.n1 = NaiveBatchNorm(c)
        self.c2 = nn.Conv2d(c, c, 3, padding=1, dtype=C64)
        self.n2 = NaiveBatchNorm(c)

    def forward(self, x):
        return crelu(self.n2(self.c2(crelu(self.n1(self.c1(x))))))


class Unet(nn.Module):
    def __init__(self, args):
        super().__init__()
        w = widths(args.width)
        self.down = nn.ModuleList()
        cin = args.channels
        for c in w:
            self.down.append(Stage(cin, c))
            cin = c
        self.up = nn.ModuleList(Stage(w[i] + w[i + 1], w[i]) for i in reversed(range(len(w) - 1)))
        self.head = nn.Conv2d(w[0], args.classes, 1, dtype=C64)

    def forward(self, x):
        skips = []
        for i, stage in enumerate(self.down):
            x = stage(x if i == 0 else maxpool_magnitude(x))
            skips.append(x)
        skips.pop()
        for stage in self.up:
            x = stage(torch.cat([skips.pop(), upsample(x)], dim=1))
        return self.head(x).abs()


def real_params(net) -> int:
    return sum(p.numel() * (2 if p.is_complex() else 1) for p in net.parameters())


def set_precision(precision: str) -> None:
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = p.parse_args()
    check_size(args.size)
    mode = "torch_unet" + ("_compile" if args.compile else "")
    dev = torch.device(args.device)
    set_precision(args.precision)
    params = None
    try:
        torch.manual_seed(0)
        net = Unet(args).to(dev)
        params = real_params(net)
        fwd = torch.compile(net) if args.compile else net
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        s = args.size
        x = torch.randn(args.batch, args.channels, s, s, dtype=C64, device=dev)
        y = torch.randint(0, args.classes, (args.batch, s, s), device=dev)
        y[torch.rand(y.shape, device=dev) < 0.1] = IGNORE

        def step():
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(fwd(x), y, ignore_index=IGNORE)
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
        r = result("pytorch", mode, args, status="ok", peak_bytes=peak, params=params,
                   loss=float(loss.detach()), torch=torch.__version__, **timed(times))
    except torch.cuda.OutOfMemoryError as e:
        r = result("pytorch", mode, args, status="oom", params=params, error=str(e)[:400])
    except Exception as e:  # torch.compile and complex tensors: report whatever it raises
        r = result("pytorch", mode, args, status="error", params=params, error=f"{type(e).__name__}: {str(e)[:400]}")
    emit(r)
    return 0 if r["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
