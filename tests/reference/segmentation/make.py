"""PyTorch reference values for the segmentation operators of cvc (issue 12).

Writes cases.json next to this file: for each case the operator, its arguments, its inputs
and parameters (fixed-seed random, float64), PyTorch's output and the gradients of
`sum(Re(conj(w) * out))` (or of the scalar loss) w.r.t. every real or complex input and
parameter. Complex tensors are stored interleaved (re, im). Read by
tests/tests/segmentation.rs. Run: /work/torchenv/bin/python tests/reference/segmentation/make.py
"""

import json
import pathlib

import torch
import torch.nn.functional as F

torch.manual_seed(12)
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


def labels(shape, classes, ignore=None, frac=0.2):
    y = torch.randint(0, classes, shape)
    if ignore is not None:
        y = torch.where(torch.rand(shape) < frac, torch.full(shape, ignore), y)
    return y


# ---- cross_entropy: PyTorch's own F.cross_entropy
x = randn(2, 4, 3, 5)
case("ce_2d_default", "cross_entropy", {}, [x, labels((2, 3, 5), 4, -100)], [],
     lambda x, y: F.cross_entropy(x, y))
x = randn(2, 4, 3, 5)
w = [0.5, 2.0, 1.0, 0.25]
case("ce_2d_weight_ignore1_smooth", "cross_entropy",
     {"weight": w, "ignore_index": 1, "label_smoothing": 0.1},
     [x, labels((2, 3, 5), 4)], [],
     lambda x, y: F.cross_entropy(x, y, weight=torch.tensor(w), ignore_index=1, label_smoothing=0.1))
x = randn(3, 3, 7)
w = [1.5, 0.5, 3.0]
case("ce_1d_weight_ignore255_smooth", "cross_entropy",
     {"weight": w, "ignore_index": 255, "label_smoothing": 0.2},
     [x, labels((3, 7), 3, 255)], [],
     lambda x, y: F.cross_entropy(x, y, weight=torch.tensor(w), ignore_index=255, label_smoothing=0.2))
x = randn(6, 5)
case("ce_samples_smooth_ignore", "cross_entropy", {"label_smoothing": 0.3, "ignore_index": -1},
     [x, labels((6,), 5, -1, 0.3)], [],
     lambda x, y: F.cross_entropy(x, y, ignore_index=-1, label_smoothing=0.3))


# ---- dice: an independent formula on torch's softmax and one_hot
def dice_ref(x, y, ignore, smooth):
    c = x.shape[1]
    valid = (y != ignore)
    yy = torch.where(valid, y, torch.zeros_like(y))
    g = F.one_hot(yy, c).movedim(-1, 1).to(x.dtype) * valid.unsqueeze(1)
    p = torch.softmax(x, 1) * valid.unsqueeze(1)
    dims = [0] + list(range(2, x.dim()))
    d = (2 * (p * g).sum(dims) + smooth) / (p.sum(dims) + g.sum(dims) + smooth)
    keep = [k for k in range(c) if k != ignore]
    return 1 - d[keep].mean()


x = randn(2, 3, 4, 4)
case("dice_2d_default", "dice", {}, [x, labels((2, 4, 4), 3, -100)], [],
     lambda x, y: dice_ref(x, y, -100, 1e-5))
x = randn(2, 4, 9)
case("dice_1d_ignore0_smooth1", "dice", {"ignore_index": 0, "smooth": 1.0}, [x, labels((2, 9), 4)], [],
     lambda x, y: dice_ref(x, y, 0, 1.0))

# ---- upsampling: F.interpolate
for s in (2, 3):
    x = cplx(2, 3, 5)
    case(f"up1d_nearest_{s}", "upsample1d", {"scale": s}, [x], [],
         lambda x, s=s: torch.complex(F.interpolate(x.real, scale_factor=s, mode="nearest"),
                                      F.interpolate(x.imag, scale_factor=s, mode="nearest")))
    x = randn(2, 3, 5)
    case(f"up1d_linear_{s}", "upsample1d", {"scale": s, "mode": "linear"}, [x], [],
         lambda x, s=s: F.interpolate(x, scale_factor=s, mode="linear", align_corners=False))
x = cplx(1, 2, 3, 4)
case("up2d_bilinear_2", "upsample2d", {"scale": 2, "mode": "linear"}, [x], [],
     lambda x: torch.complex(F.interpolate(x.real, scale_factor=2, mode="bilinear", align_corners=False),
                             F.interpolate(x.imag, scale_factor=2, mode="bilinear", align_corners=False)))
x = randn(2, 2, 3, 4)
case("up2d_bilinear_3x2", "upsample2d", {"scale": [3, 2], "mode": "linear"}, [x], [],
     lambda x: F.interpolate(x, scale_factor=(3, 2), mode="bilinear", align_corners=False))
x = randn(2, 2, 3, 4)
case("up2d_nearest_2x3", "upsample2d", {"scale": [2, 3]}, [x], [],
     lambda x: F.interpolate(x, scale_factor=(2, 3), mode="nearest"))

# ---- pooling with stride and padding
x = cplx(2, 3, 9)
case("avg1d_k3_s2_p1", "avgpool1d", {"kernel": 3, "stride": 2, "pad": 1}, [x], [],
     lambda x: torch.complex(F.avg_pool1d(x.real, 3, 2, 1), F.avg_pool1d(x.imag, 3, 2, 1)))
x = randn(2, 3, 10)
case("avg1d_k4_s3_p2_exclude", "avgpool1d", {"kernel": 4, "stride": 3, "pad": 2, "count_include_pad": False},
     [x], [], lambda x: F.avg_pool1d(x, 4, 3, 2, count_include_pad=False))
x = randn(2, 2, 7, 6)
case("avg2d_k3_s2_p1_exclude", "avgpool2d", {"kernel": 3, "stride": 2, "pad": 1, "count_include_pad": False},
     [x], [], lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False))
x = randn(2, 2, 7, 6)
case("avg2d_k3x2_s1x2_p1x0", "avgpool2d", {"kernel": [3, 2], "stride": [1, 2], "pad": [1, 0]},
     [x], [], lambda x: F.avg_pool2d(x, (3, 2), (1, 2), (1, 0)))
x = randn(2, 3, 11)
case("max1d_k3_s2_p1", "maxpool1d", {"kernel": 3, "stride": 2, "pad": 1}, [x], [],
     lambda x: F.max_pool1d(x, 3, 2, 1))
x = -short(torch.rand(2, 2, 6, 7)) - 0.5  # all negative: a padded zero would win a wrong maximum
case("max2d_k3_s1_p1_negative", "maxpool2d", {"kernel": 3, "stride": 1, "pad": 1}, [x], [],
     lambda x: F.max_pool2d(x, 3, 1, 1))
x = cplx(2, 2, 6, 7)


def maxmag2d(x, k, s, p):
    _, idx = F.max_pool2d(x.abs(), k, s, p, return_indices=True)
    flat = x.flatten(2)
    return torch.gather(flat, 2, idx.flatten(2)).reshape(idx.shape)


case("max2d_complex_k3_s2_p1", "maxpool2d", {"kernel": 3, "stride": 2, "pad": 1}, [x], [],
     lambda x: maxmag2d(x, 3, 2, 1))
x = randn(2, 3, 7)
case("adaptive1d_3_of_7", "adaptive_avgpool", {"size": 3}, [x], [], lambda x: F.adaptive_avg_pool1d(x, 3))
x = cplx(1, 2, 5, 7)
case("adaptive2d_3x2_of_5x7", "adaptive_avgpool", {"size": [3, 2]}, [x], [],
     lambda x: torch.complex(F.adaptive_avg_pool2d(x.real, (3, 2)), F.adaptive_avg_pool2d(x.imag, (3, 2))))
x = randn(2, 2, 6, 4)
case("adaptive2d_3_of_6x4", "adaptive_avgpool", {"size": 3}, [x], [], lambda x: F.adaptive_avg_pool2d(x, 3))


# ---- conv_transpose1d, complex, by its real decomposition
def ctr1d(x, w, b, stride, pad, op, groups):
    f = lambda a, c: F.conv_transpose1d(a, c, None, stride, pad, op, groups)
    re = f(x.real, w.real) - f(x.imag, w.imag)
    im = f(x.real, w.imag) + f(x.imag, w.real)
    return torch.complex(re, im) + b.reshape(1, -1, 1)


x = cplx(2, 4, 4)
case("convt1d_s2_p1_op1_g2", "conv_transpose1d",
     {"out": 6, "kernel": 3, "stride": 2, "pad": 1, "output_padding": 1, "groups": 2},
     [x], [cplx(4, 3, 3), cplx(6)], lambda x, w, b: ctr1d(x, w, b, 2, 1, 1, 2))


# ---- groupnorm / instancenorm: re and im normalised separately (cvc's naive kind)
def gn(x, groups, gr, br, gi, bi, eps=1e-5):
    return torch.complex(F.group_norm(x.real, groups, gr, br, eps), F.group_norm(x.imag, groups, gi, bi, eps))


x = cplx(2, 6, 2, 2)
case("groupnorm_3_complex", "groupnorm", {"groups": 3}, [x],
     [randn(6), randn(6), randn(6), randn(6)],
     lambda x, gr, br, gi, bi: gn(x, 3, gr, br, gi, bi))
x = randn(2, 4, 9)
case("groupnorm_2_real_eps", "groupnorm", {"groups": 2, "eps": 0.01}, [x], [randn(4), randn(4)],
     lambda x, g, b: F.group_norm(x, 2, g, b, 0.01))
x = cplx(2, 2, 2, 3)
case("instancenorm_complex", "instancenorm", {}, [x], [],
     lambda x: torch.complex(F.instance_norm(x.real), F.instance_norm(x.imag)))
x = randn(3, 2, 6)
case("instancenorm_affine_real", "instancenorm", {"affine": True}, [x], [randn(2), randn(2)],
     lambda x, g, b: F.instance_norm(x, weight=g, bias=b))

out = pathlib.Path(__file__).with_name("cases.json")
out.write_text(json.dumps({"torch": torch.__version__, "cases": cases}, separators=(",", ":"), allow_nan=False) + "\n")
print(f"{len(cases)} cases -> {out} ({out.stat().st_size} bytes)")
