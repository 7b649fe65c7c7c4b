"""Reference values of exact GELU, tanh GELU and torchcvnn's CGELU, with their gradients.

Run with the repository's PyTorch environment (torch, torchcvnn 0.10):

    /work/torchenv/bin/python tests/reference/gelu/make.py

It writes `gelu.json` next to this script; `tests/tests/reference_gelu.rs` compares the
interpreter with it. Inputs: a grid over [-6, 6] (tails, the kink-free centre) and
seeded normal samples; gradients are of `sum(w * f(x))` for a fixed seeded `w` (complex:
`sum(Re(conj(w) * f(z)))`), so `x.grad = w * f'(x)` and `z.grad` is PyTorch's conjugate
Wirtinger gradient, the convention cvc follows.
"""

import json
import pathlib

import torch
import torchcvnn.nn as cnn

torch.manual_seed(11)
dt = torch.float64

grid = torch.linspace(-6.0, 6.0, 25, dtype=dt)
x = torch.cat([grid, torch.randn(15, dtype=dt) * 2.0])
w = torch.randn(x.shape, dtype=dt)
z = torch.complex(torch.randn(12, dtype=dt) * 2.0, torch.randn(12, dtype=dt) * 2.0)
wz = torch.complex(torch.randn(12, dtype=dt), torch.randn(12, dtype=dt))


def real_case(approximate):
    xx = x.clone().requires_grad_(True)
    y = torch.nn.functional.gelu(xx, approximate=approximate)
    (w * y).sum().backward()
    return y.detach().tolist(), xx.grad.tolist()


def second_derivative(approximate):
    # d/dx of gelu'(x), for the GeluGrad primitives: autograd through the first derivative.
    xx = x.clone().requires_grad_(True)
    y = torch.nn.functional.gelu(xx, approximate=approximate)
    (d1,) = torch.autograd.grad(y.sum(), xx, create_graph=True)
    (d2,) = torch.autograd.grad(d1.sum(), xx)
    return d1.detach().tolist(), d2.tolist()


exact, exact_grad = real_case("none")
tanh, tanh_grad = real_case("tanh")
exact_d1, exact_d2 = second_derivative("none")
tanh_d1, tanh_d2 = second_derivative("tanh")

zz = z.clone().requires_grad_(True)
cg = cnn.CGELU()(zz)
(torch.conj(wz) * cg).real.sum().backward()


def pairs(t):
    return [[v.real, v.imag] for v in t.tolist()]


out = {
    "x": x.tolist(),
    "w": w.tolist(),
    "gelu": exact,
    "gelu_grad": exact_grad,
    "gelu_d1": exact_d1,
    "gelu_d2": exact_d2,
    "gelu_tanh": tanh,
    "gelu_tanh_grad": tanh_grad,
    "gelu_tanh_d1": tanh_d1,
    "gelu_tanh_d2": tanh_d2,
    "z": pairs(z),
    "wz": pairs(wz),
    "cgelu": pairs(cg.detach()),
    "cgelu_grad": pairs(zz.grad),
    "torch": torch.__version__,
}
path = pathlib.Path(__file__).with_name("gelu.json")
path.write_text(json.dumps(out, indent=1) + "\n")
print(f"wrote {path}")
