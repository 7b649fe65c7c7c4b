"""Reference values for cvc's `gru` and `lstm` layers (compiler/tests/recurrent.rs).

Run with the repository's PyTorch venv:  python tests/reference/rnn/make.py
Writes cases.txt next to this script.

Every case runs complextorch's own `GRU` / `LSTM` (its `GRUCell` / `LSTMCell`: complex
`Linear` projections, split `CSigmoid` / `CTanh`) in complex128 with batch_first=True. Its
parameters are per-gate `Linear`s (`cells_fwd[l].w_ir`, ...); they are stored here in
torch.nn.GRU/LSTM's layout and names, as cvc has them: `weight_ih_l{l}` = the gates' input
weights stacked (GRU r, z, n; LSTM i, f, g, o) `[G*H, F]`, `weight_hh_l{l}` `[G*H, H]`,
`bias_ih_l{l}` / `bias_hh_l{l}` `[G*H]`, suffix `_reverse` for `cells_bwd`. The output is the
whole sequence `[B, T, D*H]` (`output=sequence`) or the last layer's final states side by side
`[B, D*H]` (`output=last`: h_n[-D:] of complextorch, forward then backward direction). Every
case stores the input, the parameters, the output and the conjugate-Wirtinger gradients
(PyTorch's `.grad`) of  L = Σ Re(conj(w) · y)  for a random w.

Format: `case NAME key=value ...`, then one line per tensor `NAME c DIMS v v v ...` (complex
interleaved re, im; DIMS comma-separated), then `end`.
"""

import os

import torch
from complextorch.nn.modules.rnn import GRU, LSTM

HERE = os.path.dirname(os.path.abspath(__file__))
GATES = {"gru": ["r", "z", "n"], "lstm": ["i", "f", "g", "o"]}


def crandn(*shape):
    return torch.complex(torch.randn(*shape, dtype=torch.float64), torch.randn(*shape, dtype=torch.float64))


def tensor_line(name, t):
    t = t.detach()
    vals = torch.view_as_real(t.contiguous()).reshape(-1).tolist()
    dims = ",".join(str(n) for n in t.shape)
    return f"{name} c {dims} " + " ".join(repr(float(v)) for v in vals)


def stacked(cell, kind, part, what):
    """The gates' `Linear` weights (or biases) of `cell` stacked in torch's gate order."""
    return torch.cat([getattr(getattr(cell, f"w_{part}{g}").linear, what) for g in GATES[kind]], dim=0)


def case(name, kind, bsz, t, f, hidden, layers=1, bidirectional=False, output="sequence"):
    cls = GRU if kind == "gru" else LSTM
    net = cls(f, hidden, num_layers=layers, batch_first=True, bidirectional=bidirectional)
    net = net.to(torch.complex128)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(crandn(*p.shape) * 0.5)
    x = crandn(bsz, t, f).requires_grad_()
    seq, state = net(x)
    if output == "last":
        h_n = state if kind == "gru" else state[0]
        d = 2 if bidirectional else 1
        y = torch.cat([h_n[-d + k] for k in range(d)], dim=-1)
    else:
        y = seq
    w = crandn(*y.shape)
    loss = (w.conj() * y).real.sum()
    loss.backward()
    opts = f"cell={kind} hidden={hidden} layers={layers} bidirectional={int(bidirectional)} output={output}"
    lines = [f"case {name} {opts}", tensor_line("x", x)]
    grads = [tensor_line("grad.x", x.grad)]
    for layer in range(layers):
        dirs = [("", net.cells_fwd[layer])]
        if bidirectional:
            dirs.append(("_reverse", net.cells_bwd[layer]))
        for suffix, cell in dirs:
            for part, pname in [("i", "weight_ih"), ("h", "weight_hh")]:
                for what, tname in [("weight", pname), ("bias", pname.replace("weight", "bias"))]:
                    full = f"{tname}_l{layer}{suffix}"
                    lines.append(tensor_line(full, stacked(cell, kind, part, what)))
                    g = torch.cat(
                        [getattr(getattr(cell, f"w_{part}{gate}").linear, what).grad for gate in GATES[kind]],
                        dim=0,
                    )
                    grads.append(tensor_line(f"grad.{full}", g))
    lines.append(tensor_line("w", w))
    lines.append(tensor_line("y", y))
    lines.extend(grads)
    lines.append("end")
    return "\n".join(lines)


def main():
    torch.manual_seed(12)
    cases = [
        case("gru_sequence", "gru", 2, 5, 3, 4),
        case("gru_last_bidirectional_2_layers", "gru", 2, 4, 2, 3, layers=2, bidirectional=True, output="last"),
        case("lstm_sequence", "lstm", 2, 5, 3, 4),
        case("lstm_last_bidirectional_2_layers", "lstm", 3, 4, 2, 3, layers=2, bidirectional=True, output="last"),
    ]
    with open(os.path.join(HERE, "cases.txt"), "w") as f:
        f.write("\n".join(cases) + "\n")
    print("wrote", os.path.join(HERE, "cases.txt"))


if __name__ == "__main__":
    main()
