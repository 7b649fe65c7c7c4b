"""Reference values for cvc's `attention` layer (compiler/tests/attention.rs).

Run with the repository's PyTorch venv:  python tests/reference/attention/make.py
Writes cases.txt next to this script.

Cases without masks use torchcvnn 0.10's own `multi_head_attention_forward` (the function
behind `torchcvnn.nn.MultiheadAttention`) with q_norm = k_norm = Identity and dropout 0.
torchcvnn has no causal or key-padding mask and no magnitude score, so those cases are an
explicit PyTorch computation of the same formula (scores, masked softmax, weights · v).
Every case stores the inputs, the parameters (PyTorch layout, cvc names), the output and the
conjugate-Wirtinger gradients (PyTorch's `.grad`) of  L = Σ Re(conj(w) · y)  for a random w.

Format: `case NAME key=value ...`, then one line per tensor `NAME c|r DIMS v v v ...` (complex
interleaved re, im; DIMS comma-separated), then `end`.
"""

import math
import os

import torch
from torchcvnn.nn.functional import multi_head_attention_forward

HERE = os.path.dirname(os.path.abspath(__file__))


def crandn(*shape):
    return torch.complex(torch.randn(*shape, dtype=torch.float64), torch.randn(*shape, dtype=torch.float64))


def explicit(x, mem, w_in, b_in, w_out, b_out, heads, score, causal, pad):
    """softmax attention written out: torch.nn.MultiheadAttention's masks, cvc's score option."""
    bsz, t, e = x.shape
    s = mem.shape[1]
    d = e // heads
    bq = b_in[:e] if b_in is not None else None
    bkv = b_in[e:] if b_in is not None else None
    q = torch.nn.functional.linear(x, w_in[:e], bq)
    kv = torch.nn.functional.linear(mem, w_in[e:], bkv)
    k, v = kv[..., :e], kv[..., e:]
    split = lambda z, n: z.reshape(bsz, n, heads, d).transpose(1, 2)
    q, k, v = split(q, t), split(k, s), split(v, s)
    c = q @ k.conj().transpose(-2, -1)
    sc = (c.real if score == "real" else c.abs()) / math.sqrt(d)
    masked = torch.zeros(bsz, 1, t, s, dtype=torch.bool)
    if causal:
        masked = masked | torch.ones(t, s, dtype=torch.bool).triu(1)
    if pad is not None:
        masked = masked | (pad != 0)[:, None, None, :]
    sc = sc.masked_fill(masked, float("-inf"))
    p = torch.softmax(sc, dim=-1)
    o = p.to(v.dtype) @ v
    o = o.transpose(1, 2).reshape(bsz, t, e)
    return torch.nn.functional.linear(o, w_out, b_out)


def torchcvnn_mha(x, mem, w_in, b_in, w_out, b_out, heads):
    out_proj = torch.nn.Linear(x.shape[2], x.shape[2], bias=b_out is not None, dtype=torch.complex128)
    with torch.no_grad():
        out_proj.weight.copy_(w_out)
        if b_out is not None:
            out_proj.bias.copy_(b_out)
    # torchcvnn takes (T, B, E); passing the same tensor as key and value selects its packed
    # kv projection, the same tensor three times its packed qkv projection.
    q = x.transpose(0, 1)
    kv = mem.transpose(0, 1)
    y, _ = multi_head_attention_forward(
        q, kv, kv, x.shape[2], heads, torch.nn.Identity(), torch.nn.Identity(),
        w_in, b_in, 0.0, out_proj, training=False, need_weights=False,
    )
    grads_w_out = out_proj
    return y.transpose(0, 1), grads_w_out


def tensor_line(name, t):
    t = t.detach()
    if t.is_complex():
        vals = torch.view_as_real(t.contiguous()).reshape(-1).tolist()
        kind = "c"
    else:
        vals = t.reshape(-1).tolist()
        kind = "r"
    dims = ",".join(str(n) for n in t.shape)
    return f"{name} {kind} {dims} " + " ".join(repr(float(v)) for v in vals)


def case(name, bsz, t, s, e, heads, bias=True, cross=False, score="real", causal=False, pad=False):
    x = crandn(bsz, t, e).requires_grad_()
    mem = crandn(bsz, s, e).requires_grad_() if cross else x
    w_in = (crandn(3 * e, e) / math.sqrt(e)).requires_grad_()
    b_in = (crandn(3 * e) * 0.3).requires_grad_() if bias else None
    w_out = (crandn(e, e) / math.sqrt(e)).requires_grad_()
    b_out = (crandn(e) * 0.3).requires_grad_() if bias else None
    padm = None
    if pad:
        padm = (torch.rand(bsz, s, dtype=torch.float64) < 0.35).to(torch.float64)
        padm[:, 0] = 0.0  # keep every row with at least one key (cvc's empty-row rule is tested apart)
    use_torchcvnn = score == "real" and not causal and padm is None
    if use_torchcvnn:
        y, out_proj = torchcvnn_mha(x, mem, w_in, b_in, w_out, b_out, heads)
    else:
        y = explicit(x, mem, w_in, b_in, w_out, b_out, heads, score, causal, padm)
    w = crandn(*y.shape)
    loss = (w.conj() * y).real.sum()
    loss.backward()
    if use_torchcvnn:
        g_w_out = out_proj.weight.grad
        g_b_out = out_proj.bias.grad if bias else None
    else:
        g_w_out, g_b_out = w_out.grad, (b_out.grad if bias else None)
    opts = f"heads={heads} bias={int(bias)} cross={int(cross)} score={score} causal={int(causal)} pad={int(pad)}"
    lines = [f"case {name} {opts} source={'torchcvnn' if use_torchcvnn else 'explicit'}"]
    lines.append(tensor_line("x", x))
    if cross:
        lines.append(tensor_line("memory", mem))
    if padm is not None:
        lines.append(tensor_line("pad", padm))
    lines.append(tensor_line("in_proj_weight", w_in))
    lines.append(tensor_line("out_proj.weight", w_out))
    if bias:
        lines.append(tensor_line("in_proj_bias", b_in))
        lines.append(tensor_line("out_proj.bias", b_out))
    lines.append(tensor_line("w", w))
    lines.append(tensor_line("y", y))
    lines.append(tensor_line("grad.x", x.grad))
    if cross:
        lines.append(tensor_line("grad.memory", mem.grad))
    lines.append(tensor_line("grad.in_proj_weight", w_in.grad))
    lines.append(tensor_line("grad.out_proj.weight", g_w_out))
    if bias:
        lines.append(tensor_line("grad.in_proj_bias", b_in.grad))
        lines.append(tensor_line("grad.out_proj.bias", g_b_out))
    lines.append("end")
    return "\n".join(lines)


def main():
    torch.manual_seed(11)
    cases = [
        case("self_real", 2, 5, 5, 6, 2),
        case("cross_real_nobias", 2, 4, 3, 4, 1, bias=False, cross=True),
        case("self_abs_causal", 2, 5, 5, 6, 3, score="abs", causal=True),
        case("cross_pad", 3, 3, 6, 4, 2, cross=True, pad=True),
    ]
    with open(os.path.join(HERE, "cases.txt"), "w") as f:
        f.write("\n".join(cases) + "\n")
    print("wrote", os.path.join(HERE, "cases.txt"))


if __name__ == "__main__":
    main()
