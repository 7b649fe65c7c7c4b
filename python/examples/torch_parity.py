"""The same complex network in PyTorch and in cvc, from one state dict: same loss, outputs,
gradients and, after some SGD steps, the same parameters.

    python python/examples/torch_parity.py [--batch 16] [--steps 3] [--device cpu]

The PyTorch module mirrors cvc's names (see python/README.md): the binding ``logits`` is a
submodule whose children are named ``<op>_<k>``, so ``module.state_dict()`` and
``session.state_dict()`` have the same keys, shapes and dtypes, and load into each other
(``nn.Linear``'s ``[out, in]`` weight is cvc's layout too: nothing is transposed).
Exits non-zero when any quantity differs by more than its tolerance.
"""

import argparse
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import cvc

SOURCE = """\
model Parity {
    input x:     c64[B, 2, 16]
    input label: class[B] of 3

    logits = x |> conv1d(4, kernel = 3, pad = 1) |> modrelu |> flatten |> linear(3) |> abs
    output logits
    loss cross_entropy(logits, label)
}

train Parity {
    batch     = 8
    optimizer = sgd(lr = 0.05)
    seed      = 3
}
"""
LR = 0.05


class ModReLU(nn.Module):
    """cvc's ``modrelu``: ``z · relu(|z| + b) / max(|z|, 1e-12)``, one real bias per channel."""

    def __init__(self, channels: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        m = z.abs()
        b = self.bias.view(1, -1, *([1] * (z.dim() - 2)))
        return z * (torch.relu(m + b) / m.clamp_min(1e-12))


class Logits(nn.Module):
    """The binding ``logits``: its layers under cvc's names ``<op>_<k>``."""

    def __init__(self):
        super().__init__()
        self.conv1d_0 = nn.Conv1d(2, 4, 3, padding=1, dtype=torch.complex64)
        self.modrelu_0 = ModReLU(4)
        self.linear_0 = nn.Linear(4 * 16, 3, dtype=torch.complex64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.modrelu_0(self.conv1d_0(x))
        return self.linear_0(h.flatten(1)).abs()


class Parity(nn.Module):
    """The whole model: one binding."""

    def __init__(self):
        super().__init__()
        self.logits = Logits()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits(x)


def make_torch_model(seed: int) -> Parity:
    """PyTorch's initialisation, with a random modrelu bias (cvc's starts at zero)."""
    torch.manual_seed(seed)
    net = Parity()
    with torch.no_grad():
        net.logits.modrelu_0.bias.uniform_(-0.3, 0.3)
    return net


def random_batch(rng: np.random.Generator, n: int) -> dict:
    x = (rng.standard_normal((n, 2, 16)) + 1j * rng.standard_normal((n, 2, 16))).astype(np.complex64)
    return {"x": x, "label": rng.integers(0, 3, n).astype(np.int32)}


def torch_step(net: Parity, batch: dict):
    """Loss, logits and gradients of the PyTorch model on a batch (no update)."""
    net.zero_grad()
    logits = net(torch.from_numpy(batch["x"]))
    loss = F.cross_entropy(logits, torch.from_numpy(batch["label"]).long())
    loss.backward()
    grads = {k: p.grad.detach().numpy().copy() for k, p in net.named_parameters()}
    return loss.item(), logits.detach().numpy(), grads


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| relative to the reference's largest magnitude."""
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def compare(args) -> dict:
    """Runs both and returns the largest relative error of each quantity."""
    rng = np.random.default_rng(args.seed)
    net = make_torch_model(args.seed)
    session = cvc.Model.from_source(SOURCE, "parity.cvnn").session(device=args.device, batch=args.batch)
    session.load_state_dict(net.state_dict())
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    worst = {"loss": 0.0, "logits": 0.0, "gradients": 0.0, "parameters": 0.0}
    for step in range(args.steps):
        batch = random_batch(rng, args.batch)
        t_loss, t_logits, t_grads = torch_step(net, batch)
        c_grads = session.gradients(batch)
        c = session.train_step(batch)
        opt.step()
        worst["loss"] = max(worst["loss"], abs(c.loss - t_loss) / max(abs(t_loss), 1e-30))
        worst["logits"] = max(worst["logits"], rel_err(c.outputs["logits"], t_logits))
        for k, g in t_grads.items():
            worst["gradients"] = max(worst["gradients"], rel_err(c_grads[k], g))
        c_state = session.state_dict()
        for k, p in net.state_dict().items():
            worst["parameters"] = max(worst["parameters"], rel_err(c_state[k], p.numpy()))
        print(f"step {step}: loss torch {t_loss:.6f} cvc {c.loss:.6f}")
    return worst


TOLERANCES = {"loss": 1e-5, "logits": 1e-5, "gradients": 1e-4, "parameters": 1e-5}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda", "interp"])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    worst = compare(args)
    ok = True
    for k, err in worst.items():
        good = err <= TOLERANCES[k]
        ok &= good
        print(f"{k:<10} max relative difference {err:.2e} (tolerance {TOLERANCES[k]:.0e}) {'ok' if good else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
