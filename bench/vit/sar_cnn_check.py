"""Is a `cvc data sar` file learnable at all? A small real CNN on per-image-normalised |x|.

    cvc data sar --out /tmp/sar.npz --count 4000 --scr-db 15..25 --seed 11
    python3 bench/vit/sar_cnn_check.py /tmp/sar.npz

First 3,000 images: 2,700 for training, 300 for validation; four conv+ReLU layers with max
pooling, global max pool, a linear head, Adam 1e-3, batch 64, 5 epochs; prints
`epoch last_batch_loss val_acc seconds` per epoch. (bench/vit/sar_baselines.py's CNN reads
log(1 + |x|) without dividing by each image's spread and stays at chance: the per-image gain
spans 10× in amplitude.)
"""

import sys
import time

import numpy as np
import torch
import torch.nn as nn

torch.set_num_threads(1)
d = np.load(sys.argv[1])
x = d["image"][:3000]
y = d["label"][:3000]
a = np.abs(x)
a = a / a.reshape(len(a), -1).std(1)[:, None, None, None]
X = torch.tensor(a, dtype=torch.float32)
Y = torch.tensor(y).long()
n = 2700
net = nn.Sequential(
    nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveMaxPool2d(1),
    nn.Flatten(), nn.Linear(32, 4))
opt = torch.optim.Adam(net.parameters(), 1e-3)
for ep in range(5):
    perm = torch.randperm(n)
    t = time.time()
    for i in range(0, n, 64):
        idx = perm[i:i + 64]
        loss = nn.functional.cross_entropy(net(X[idx]), Y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        acc = (net(X[n:]).argmax(1) == Y[n:]).float().mean().item()
    print(ep, round(loss.item(), 3), acc, round(time.time() - t), flush=True)
