"""Can the ViT of examples/vit_sar.cvnn learn a synthetic.sar file? One JSON line per epoch.

    cvc data sar --out /tmp/sar.npz --count 8000 --scr-db 15..25 --seed 11
    python3 bench/vit/learn_sar.py /tmp/sar.npz --epochs 10 [--lr 3e-4] [--warmup 0] [--norm-input]

bench/vit/torch_vit.py's network (the same as the example: 12 layers, dim 192, 3 heads, MLP
768, per-sample RMSNorm, CGELU, mean over tokens, |linear|) trained with Adam and a cosine
schedule (optionally a linear warmup, in epochs) on the first 90% of the file, validation
accuracy on the rest after every epoch. TF32 matmuls (a learnability check, not a benchmark).
`--norm-input` divides each image by its RMS first. Stops after `--time-limit` seconds.
"""

import argparse
import json
import math
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import torch_vit


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--min-lr", type=float, default=1e-5)
    p.add_argument("--warmup", type=float, default=0.0, help="linear warmup, in epochs")
    p.add_argument("--norm-input", action="store_true")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--dim", type=int, default=192)
    p.add_argument("--heads", type=int, default=3)
    p.add_argument("--mlp", type=int, default=768)
    p.add_argument("--time-limit", type=float, default=1e9)
    p.add_argument("--tag", default="")
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(1)
    d = np.load(a.data)
    x = torch.tensor(d["image"]).to(a.device)
    y = torch.tensor(d["label"]).long().to(a.device)
    if a.norm_input:
        x = x / x.abs().square().mean(dim=(1, 2, 3), keepdim=True).sqrt()
    a.tokens = (x.shape[-1] // 4) ** 2
    a.classes = int(y.max().item()) + 1
    n = int(0.9 * len(x))
    net = torch_vit.Vit(a).to(a.device)
    opt = torch.optim.Adam(net.parameters(), a.lr)
    steps_per_epoch = n // a.batch
    total = steps_per_epoch * a.epochs
    warm = int(a.warmup * steps_per_epoch)

    def lr_at(s):
        if s < warm:
            return a.lr * (s + 1) / warm
        t = (s - warm) / max(1, total - warm)
        return a.min_lr + 0.5 * (a.lr - a.min_lr) * (1 + math.cos(math.pi * t))

    t0 = time.time()
    step = 0
    for ep in range(a.epochs):
        perm = torch.randperm(n, device=a.device)
        tl = 0.0
        for i in range(steps_per_epoch):
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            idx = perm[i * a.batch:(i + 1) * a.batch]
            loss = F.cross_entropy(net(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            tl += loss.item()
            step += 1
        net.eval()
        with torch.no_grad():
            right = sum((net(x[j:j + 256]).argmax(1) == y[j:j + 256]).sum().item() for j in range(n, len(x), 256))
        net.train()
        print(json.dumps(dict(tag=a.tag, epoch=ep + 1, train_loss=tl / steps_per_epoch,
                              val_acc=right / (len(x) - n), s=round(time.time() - t0, 1))), flush=True)
        if time.time() - t0 > a.time_limit:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
