"""Train a complex CNN on radio bursts with a PyTorch DataLoader feeding a cvc session.

    python python/examples/train_rf.py [--epochs 4] [--count 4096] [--device auto] [--out runs/rf-py]

The data pipeline is ordinary PyTorch (a ``Dataset`` making noisy BPSK/QPSK/8PSK/16QAM
bursts, a shuffling ``DataLoader`` with workers); cvc runs the compiled training step.
Each epoch ends with a validation pass and a checkpoint (``epoch<N>.safetensors`` and
``best.safetensors``, loadable by ``session.load`` or ``cvc eval``). A progress bar is shown
when tqdm is installed, plain lines otherwise. ``--resume FILE`` continues from a checkpoint.
"""

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

import cvc

try:
    from tqdm import tqdm
except ImportError:  # plain prints instead
    tqdm = None

CLASSES = ["bpsk", "qpsk", "8psk", "16qam"]
LENGTH = 128
SOURCE = f"""\
model Burst {{
    input iq:    c64[B, 1, {LENGTH}]
    input label: class[B] of {len(CLASSES)}

    logits = iq
        |> conv1d(8, kernel = 5, pad = 2) |> batchnorm(kind = naive) |> modrelu
        |> maxpool1d(2)
        |> conv1d(16, kernel = 3, pad = 1) |> modrelu
        |> abs |> global_avgpool |> linear({len(CLASSES)}) |> real
    output logits
    loss cross_entropy(logits, label)
}}

train Burst {{
    batch     = 32
    optimizer = adam(lr = 1e-2)
    seed      = 1
}}
"""


def constellation(kind: str) -> np.ndarray:
    if kind == "16qam":
        re, im = np.meshgrid([-3, -1, 1, 3], [-3, -1, 1, 3])
        pts = (re + 1j * im).ravel()
        return pts / np.sqrt(np.mean(np.abs(pts) ** 2))
    m = {"bpsk": 2, "qpsk": 4, "8psk": 8}[kind]
    return np.exp(2j * np.pi * np.arange(m) / m)


class RfBursts(Dataset):
    """Noisy bursts of random symbols (4 samples each) with a random carrier phase and a small
    frequency offset; item ``i`` is a fixed function of ``(seed, i)``."""

    def __init__(self, count: int, seed: int, snr_db=(5.0, 20.0)):
        self.count, self.seed, self.snr_db = count, seed, snr_db
        self.points = [constellation(c) for c in CLASSES]

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int):
        rng = np.random.default_rng((self.seed, i))
        label = int(rng.integers(len(CLASSES)))
        pts = self.points[label]
        symbols = pts[rng.integers(len(pts), size=LENGTH // 4)]
        t = np.arange(LENGTH)
        carrier = np.exp(1j * (rng.uniform(0, 2 * np.pi) + rng.uniform(-0.02, 0.02) * t))
        sig = np.repeat(symbols, 4) * carrier
        snr = 10 ** (rng.uniform(*self.snr_db) / 10)
        noise = (rng.standard_normal(LENGTH) + 1j * rng.standard_normal(LENGTH)) / np.sqrt(2 * snr)
        return {"iq": (sig + noise).astype(np.complex64)[None, :], "label": label}


def progress(loader, desc: str, quiet: bool):
    if tqdm is not None and not quiet:
        return tqdm(loader, desc=desc, leave=False)
    return loader


def validate(session: cvc.Session, loader: DataLoader):
    """Sample-weighted mean loss and accuracy over a loader (inference mode)."""
    loss_sum, right, n = 0.0, 0, 0
    for batch in loader:
        r = session.evaluate(batch)
        k = r["metrics"]["count"]
        loss_sum += r["loss"] * k
        right += r["metrics"]["correct"]
        n += k
    return loss_sum / n, right / n


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--count", type=int, default=4096, help="training bursts (validation: a quarter)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "interp"])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("runs/rf-py"))
    p.add_argument("--resume", type=Path, help="a checkpoint to continue from")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)

    model = cvc.Model.from_source(SOURCE, "burst.cvnn")
    session = model.session(device=args.device, batch=args.batch)
    start_epoch = 0
    if args.resume:
        meta = session.load(args.resume)
        start_epoch = int(meta.get("epoch", "0"))
        print(f"resumed from {args.resume} (epoch {start_epoch})")
    print(f"model {model.name} on {session.device}, batch {session.batch}")

    train = DataLoader(RfBursts(args.count, seed=1), batch_size=session.batch, shuffle=True,
                       drop_last=True, num_workers=args.workers,
                       generator=torch.Generator().manual_seed(0))
    val = DataLoader(RfBursts(max(args.count // 4, 1), seed=2), batch_size=256, num_workers=args.workers)
    args.out.mkdir(parents=True, exist_ok=True)
    best = -1.0
    steps = len(train) * args.epochs
    history = []
    for epoch in range(start_epoch, start_epoch + args.epochs):
        t0 = time.time()
        loss_sum, right, n = 0.0, 0, 0
        bar = progress(train, f"epoch {epoch + 1}", args.quiet)
        for i, batch in enumerate(bar):
            done = (epoch - start_epoch) * len(train) + i
            session.lr = args.lr * 0.5 * (1 + math.cos(math.pi * done / steps))  # cosine schedule
            r = session.train_step(batch)
            loss_sum += r.loss * session.batch
            right += r.metrics["correct"]
            n += session.batch
            if tqdm is not None and not args.quiet:
                bar.set_postfix(loss=f"{loss_sum / n:.3f}", acc=f"{right / n:.1%}")
        val_loss, val_acc = validate(session, val)
        history.append({"epoch": epoch + 1, "train_loss": loss_sum / n, "val_loss": val_loss, "val_acc": val_acc})
        print(f"epoch {epoch + 1}: train loss {loss_sum / n:.4f} acc {right / n:.1%}  "
              f"val loss {val_loss:.4f} acc {val_acc:.1%}  ({time.time() - t0:.1f} s)")
        meta = {"epoch": str(epoch + 1), "val_acc": f"{val_acc:.4f}"}
        session.save(args.out / f"epoch{epoch + 1}.safetensors", meta)
        if val_acc > best:
            best = val_acc
            session.save(args.out / "best.safetensors", meta)
    print(f"best validation accuracy {best:.1%}; checkpoints in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
