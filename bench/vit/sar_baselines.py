"""How hard synthetic.sar is: validation accuracy of simple PyTorch models on a `cvc data sar` file.

    cvc data sar --out /tmp/sar.npz --count 4000
    python3 bench/vit/sar_baselines.py /tmp/sar.npz [--epochs 15] [--vit]

- linear: multinomial logistic regression on |x| (standardised pixels), Adam, L2;
- cnn: a small real CNN on log(1 + |x|) (3 conv layers, global max pool);
- vit (--vit): bench/vit/torch_vit.py's complex ViT at a small size (4 layers, dim 64,
  2 heads, patch 4) on the complex images.
Prints one JSON line per model: {"model", "train_acc", "val_acc", "epochs"}. Split 90/10 as
the train section's default (split by a fixed permutation, not cvc's).
"""

import argparse
import json
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def accuracy(model, x, y, batch=256):
    model.eval()
    right = 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            right += (model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum().item()
    model.train()
    return right / len(x)


def fit(model, xt, yt, xv, yv, epochs, lr, wd=0.0, batch=64):
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=wd)
    g = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        perm = torch.randperm(len(xt), generator=g)
        for i in range(0, len(xt), batch):
            idx = perm[i:i + batch]
            opt.zero_grad()
            F.cross_entropy(model(xt[idx]), yt[idx]).backward()
            opt.step()
    return accuracy(model, xt, yt), accuracy(model, xv, yv)


class Cnn(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.c = nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                               nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                               nn.Conv2d(32, 64, 3, padding=1), nn.ReLU())
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        return self.fc(self.c(x).amax((2, 3)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("npz")
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--vit", action="store_true")
    a = p.parse_args()
    torch.manual_seed(0)
    d = np.load(a.npz)
    img = torch.from_numpy(d["image"])
    y = torch.from_numpy(d["label"]).long()
    classes = int(y.max()) + 1
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(1))
    cut = int(0.9 * len(y))
    tr, va = perm[:cut], perm[cut:]

    mag = img.abs()
    flat = mag.flatten(1)
    mu, sd = flat[tr].mean(0), flat[tr].std(0) + 1e-6
    z = (flat - mu) / sd
    lin = nn.Linear(z.shape[1], classes)
    t, v = fit(lin, z[tr], y[tr], z[va], y[va], a.epochs, 1e-3, wd=1e-3)
    print(json.dumps(dict(model="linear_on_abs", train_acc=t, val_acc=v, epochs=a.epochs)), flush=True)

    lm = torch.log1p(mag / mag.flatten(1).mean(1).view(-1, 1, 1, 1))
    cnn = Cnn(classes)
    t, v = fit(cnn, lm[tr], y[tr], lm[va], y[va], a.epochs, 2e-3)
    print(json.dumps(dict(model="small_cnn_on_log_abs", train_acc=t, val_acc=v, epochs=a.epochs)), flush=True)

    if a.vit:
        sys.path.insert(0, __file__.rsplit("/", 1)[0])
        import torch_vit
        side = img.shape[-1]
        args = argparse.Namespace(tokens=(side // 4) ** 2, dim=64, heads=2, mlp=128, layers=4, classes=classes)
        vit = torch_vit.Vit(args)
        t, v = fit(vit, img[tr], y[tr], img[va], y[va], a.epochs, 5e-4)
        print(json.dumps(dict(model="small_complex_vit", train_acc=t, val_acc=v, epochs=a.epochs)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
