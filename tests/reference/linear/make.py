"""Reference values for `linear` loading PyTorch weights (compiler/tests/layers.rs,
`linear_loads_pytorch_nn_linear_weights`).

    /work/torchenv/bin/python tests/reference/linear/make.py

Writes `nn_linear.txt` next to it: for a non-square and a square `torch.nn.Linear` (complex64,
PyTorch's own initialisation from a fixed seed) applied to a random sequence `x [N, T, in]`,
the input, `weight [out, in]`, `bias [out]` and PyTorch's output `y [N, T, out]`. One
`case N T IN OUT` line, then one line per tensor: `NAME` and its values as re im pairs
(float64 `repr` of the complex64 values).
"""

import os

import torch

torch.manual_seed(20261201)
lines = []
for n, t, i, o in [(2, 3, 5, 4), (2, 3, 4, 4)]:
    lin = torch.nn.Linear(i, o, dtype=torch.complex64)
    x = torch.randn(n, t, i, dtype=torch.complex64)
    with torch.no_grad():
        y = lin(x)

    def row(name, z):
        flat = torch.view_as_real(z.detach().contiguous()).reshape(-1).tolist()
        return name + " " + " ".join(repr(float(v)) for v in flat)

    lines.append(f"case {n} {t} {i} {o}")
    lines += [row("x", x), row("weight", lin.weight), row("bias", lin.bias), row("y", y)]

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nn_linear.txt")
with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
