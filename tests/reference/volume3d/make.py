"""PyTorch reference values for cvc's volume operators (issue 12): conv3d, conv_transpose3d,
avgpool3d, maxpool3d (complex: by magnitude) and fft3/ifft3 on [B, C, D, H, W] tensors.

Writes cases.json next to this file: for each case the operator, its arguments, its inputs
and parameters (fixed-seed random, float64), PyTorch's output and the gradients of
`sum(Re(conj(w) * out))` w.r.t. every real or complex input and parameter. Complex tensors
are stored interleaved (re, im); complex convolutions are PyTorch's real convolutions of the
real and imaginary parts (an oracle independent of PyTorch's complex kernels). Read by
tests/tests/volume3d.rs. Run: /work/torchenv/bin/python tests/reference/volume3d/make.py
"""

import json
import pathlib

import torch
import torch.nn.functional as F

torch.manual_seed(13)
torch.set_default_dtype(torch.float64)


def enc(t, digits=None):
    """`digits`: significant digits kept (results: 12, ample for a 1e-9 comparison)."""
    t = t.detach()
    if digits is not None and (t.is_floating_point() or t.is_complex()):
        r = enc(t)
        r["data"] = [float(f"{v:.{digits}g}") for v in r["data"]]
        return r
    if t.is_complex():
        return {"dtype": "c64", "shape": list(t.shape), "data": torch.view_as_real(t).reshape(-1).tolist()}
    if t.dtype in (torch.int64, torch.int32):
        return {"dtype": "i32", "shape": list(t.shape), "data": t.reshape(-1).tolist()}
    return {"dtype": "f32", "shape": list(t.shape), "data": t.reshape(-1).tolist()}


def short(t):
    """Rounded to 4 decimals, so the stored inputs are short and exactly what was computed on."""
    return torch.round(t * 1e4) / 1e4


def randn(*shape):
    return short(torch.randn(*shape))


def cplx(*shape):
    return torch.complex(randn(*shape), randn(*shape))


cases = []


def case(name, op, args, inputs, params, fn):
    """`fn(*inputs, *params)` in PyTorch; differentiates w.r.t. every float input and param."""
    leaves = [t.clone().requires_grad_(t.is_floating_point() or t.is_complex()) for t in inputs + params]
    out = fn(*leaves)
    if out.dim() == 0:
        weight = None
        loss = out
    else:
        weight = cplx(*out.shape) if out.is_complex() else randn(*out.shape)
        loss = (weight.conj() * out).real.sum() if out.is_complex() else (weight * out).sum()
    loss.backward()
    grads = [enc(t.grad, 12) if t.requires_grad else None for t in leaves]
    cases.append({
        "name": name,
        "op": op,
        "args": args,
        "inputs": [enc(t) for t in inputs],
        "params": [enc(t) for t in params],
        "out": enc(out, 12),
        "weight": None if weight is None else enc(weight),
        "grads": grads[: len(inputs)],
        "param_grads": grads[len(inputs):],
    })




def cconv3d(x, w, b, stride=1, pad=0, dilation=1, groups=1):
    f = lambda a, c: F.conv3d(a, c, None, stride, pad, dilation, groups)
    if not x.is_complex():
        y = torch.complex(f(x, w.real), f(x, w.imag))
    else:
        y = torch.complex(f(x.real, w.real) - f(x.imag, w.imag), f(x.real, w.imag) + f(x.imag, w.real))
    return y if b is None else y + b.reshape(1, -1, 1, 1, 1)


def cconvt3d(x, w, b, stride=1, pad=0, op=0, dilation=1, groups=1):
    f = lambda a, c: F.conv_transpose3d(a, c, None, stride, pad, op, groups, dilation)
    y = torch.complex(f(x.real, w.real) - f(x.imag, w.imag), f(x.real, w.imag) + f(x.imag, w.real))
    return y if b is None else y + b.reshape(1, -1, 1, 1, 1)


def maxmag3d(x, k, s, p):
    _, idx = F.max_pool3d(x.abs(), k, s, p, return_indices=True)
    flat = x.flatten(2)
    return torch.gather(flat, 2, idx.flatten(2)).reshape(idx.shape)


def split(f):
    """`f` applied to the real and imaginary parts of a complex tensor."""
    return lambda x: torch.complex(f(x.real), f(x.imag))


# ---- conv3d
x = cplx(2, 3, 4, 5, 5)
case("conv3d_k3_p1", "conv3d", {"out": 4, "kernel": 3, "pad": 1}, [x], [cplx(4, 3, 3, 3, 3), cplx(4)],
     lambda x, w, b: cconv3d(x, w, b, 1, 1))
x = cplx(2, 2, 5, 6, 7)
case("conv3d_k323_s212_p101", "conv3d",
     {"out": 3, "kernel": [3, 2, 3], "stride": [2, 1, 2], "pad": [1, 0, 1]},
     [x], [cplx(3, 2, 3, 2, 3), cplx(3)], lambda x, w, b: cconv3d(x, w, b, (2, 1, 2), (1, 0, 1)))
x = randn(2, 4, 6, 4, 5)
case("conv3d_real_input_dil211_g2", "conv3d",
     {"out": 2, "kernel": [2, 3, 2], "dilation": [2, 1, 1], "groups": 2, "pad": [0, 1, 1]},
     [x], [cplx(2, 2, 2, 3, 2), cplx(2)],
     lambda x, w, b: cconv3d(x, w, b, 1, (0, 1, 1), (2, 1, 1), 2))
x = cplx(1, 2, 3, 8, 7)
case("conv3d_k122_s133_nobias", "conv3d",
     {"out": 2, "kernel": [1, 2, 2], "stride": [1, 3, 3], "bias": False},
     [x], [cplx(2, 2, 1, 2, 2)], lambda x, w: cconv3d(x, w, None, (1, 3, 3)))
x = cplx(2, 2, 5, 6, 6)
case("conv3d_k3_s2_p1_dil2hw", "conv3d",
     {"out": 2, "kernel": 3, "stride": 2, "pad": 1, "dilation": [1, 2, 2]},
     [x], [cplx(2, 2, 3, 3, 3), cplx(2)], lambda x, w, b: cconv3d(x, w, b, 2, 1, (1, 2, 2)))

# ---- conv_transpose3d (weight [in, out / groups, kd, kh, kw])
x = cplx(2, 3, 3, 4, 3)
case("convt3d_k3_s2_p1_op1", "conv_transpose3d",
     {"out": 2, "kernel": 3, "stride": 2, "pad": 1, "output_padding": 1},
     [x], [cplx(3, 2, 3, 3, 3), cplx(2)], lambda x, w, b: cconvt3d(x, w, b, 2, 1, 1))
x = cplx(2, 4, 3, 3, 2)
case("convt3d_s123_p011_op012_dil211_g2", "conv_transpose3d",
     {"out": 4, "kernel": [2, 3, 3], "stride": [1, 2, 3], "pad": [0, 1, 1], "output_padding": [0, 1, 2],
      "dilation": [2, 1, 1], "groups": 2},
     [x], [cplx(4, 2, 2, 3, 3), cplx(4)],
     lambda x, w, b: cconvt3d(x, w, b, (1, 2, 3), (0, 1, 1), (0, 1, 2), (2, 1, 1), 2))
x = cplx(1, 2, 2, 3, 4)
case("convt3d_k231_s312_gaps", "conv_transpose3d",
     {"out": 3, "kernel": [2, 3, 1], "stride": [3, 1, 2], "bias": False},
     [x], [cplx(2, 3, 2, 3, 1)], lambda x, w: cconvt3d(x, w, None, (3, 1, 2)))
x = cplx(2, 2, 2, 2, 2)
case("convt3d_k4_s2_p1_dil2d", "conv_transpose3d",
     {"out": 2, "kernel": [2, 4, 4], "stride": 2, "pad": [1, 1, 1], "dilation": [2, 1, 1]},
     [x], [cplx(2, 2, 2, 4, 4), cplx(2)], lambda x, w, b: cconvt3d(x, w, b, 2, 1, 0, (2, 1, 1)))

# ---- avgpool3d
x = cplx(2, 2, 4, 6, 5)
case("avg3d_k2_complex", "avgpool3d", {"kernel": 2}, [x], [], split(lambda t: F.avg_pool3d(t, 2)))
x = randn(2, 2, 5, 6, 7)
case("avg3d_k3_s2_p1_exclude", "avgpool3d", {"kernel": 3, "stride": 2, "pad": 1, "count_include_pad": False},
     [x], [], lambda x: F.avg_pool3d(x, 3, 2, 1, count_include_pad=False))
x = cplx(1, 2, 5, 4, 6)
case("avg3d_k322_s121_p101", "avgpool3d", {"kernel": [3, 2, 2], "stride": [1, 2, 1], "pad": [1, 0, 1]},
     [x], [], split(lambda t: F.avg_pool3d(t, (3, 2, 2), (1, 2, 1), (1, 0, 1))))

# ---- maxpool3d
x = -short(torch.rand(2, 2, 4, 5, 6)) - 0.5  # all negative: a padded zero would win a wrong maximum
case("max3d_k3_s1_p1_negative", "maxpool3d", {"kernel": 3, "stride": 1, "pad": 1}, [x], [],
     lambda x: F.max_pool3d(x, 3, 1, 1))
x = randn(2, 2, 4, 5, 6)
case("max3d_k2_real", "maxpool3d", {"kernel": 2}, [x], [], lambda x: F.max_pool3d(x, 2))
x = cplx(2, 2, 5, 6, 4)
case("max3d_complex_k232_s221_p110", "maxpool3d", {"kernel": [2, 3, 2], "stride": [2, 2, 1], "pad": [1, 1, 0]},
     [x], [], lambda x: maxmag3d(x, (2, 3, 2), (2, 2, 1), (1, 1, 0)))
x = cplx(2, 2, 4, 4, 6)
case("max3d_complex_k2", "maxpool3d", {"kernel": 2}, [x], [], lambda x: maxmag3d(x, 2, 2, 0))

# ---- FFT over a volume's three axes (and one axis of a 5-D tensor)
x = cplx(2, 2, 4, 5, 6)
case("fft3_backward", "fft3", {}, [x], [], lambda x: torch.fft.fftn(x, dim=(-3, -2, -1)))
x = cplx(2, 1, 3, 4, 5)
case("ifft3_ortho", "ifft3", {"norm": "ortho"}, [x], [], lambda x: torch.fft.ifftn(x, dim=(-3, -2, -1), norm="ortho"))
x = randn(2, 1, 4, 3, 5)
case("fft3_real_input_forward", "fft3", {"norm": "forward"}, [x], [],
     lambda x: torch.fft.fftn(x, dim=(-3, -2, -1), norm="forward"))
x = cplx(2, 2, 6, 3, 4)
case("fft_depth_axis", "fft", {"axis": 2}, [x], [], lambda x: torch.fft.fft(x, dim=2))

out = pathlib.Path(__file__).with_name("cases.json")
out.write_text(json.dumps({"torch": torch.__version__, "cases": cases}, separators=(",", ":"), allow_nan=False) + "\n")
print(f"{len(cases)} cases -> {out} ({out.stat().st_size} bytes)")
