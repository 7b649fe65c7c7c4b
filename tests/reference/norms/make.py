"""Reference values for cvc's per-sample norms, softmax and reductions (issue 11).

Each case applies one operator to a small random input, with random (not initial) parameters
so the affine maps are exercised, and records the output and the gradients of the probe loss
L = sum(Re(conj(w) * y)) (real outputs: sum(w * y)) w.r.t. the input and every parameter, in
PyTorch's convention (dL/dre + i dL/dim), which is cvc's. The layers are complextorch 2.1.1's
`LayerNorm` and `RMSNorm` and torch.nn's `LayerNorm`, `RMSNorm`, `softmax`, `log_softmax`,
`sum`, `mean`; the naive complex layer norm (no complextorch module) is written out here from
torch.nn.functional.layer_norm on the real and imaginary parts.

Inputs and parameters are drawn in float32 and the layers run in float64 on those values, so
the reference is exact to float64 for the float32 values cvc's interpreter reads.

Run with /work/torchenv/bin/python tests/reference/norms/make.py; writes <case>.npz and
cases.json next to this file. tests/tests/norms_reference.rs reads them.
"""

import json
import os

import numpy as np
import torch
import complextorch.nn as ctnn

HERE = os.path.dirname(os.path.abspath(__file__))
BATCH = 2
gen = torch.Generator().manual_seed(11)


def rand(shape, complex_):
    """A float32 (or complex64) random tensor, returned in float64 (complex128)."""
    if complex_:
        re = torch.randn(shape, generator=gen, dtype=torch.float32)
        im = torch.randn(shape, generator=gen, dtype=torch.float32)
        return torch.complex(re, im).to(torch.complex128)
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(torch.float64)


def naive_layer_norm(x, ns, weight, bias, eps):
    """Re and im each normalised over the last len(ns) axes, then complextorch's 2x2 affine."""
    zr = torch.nn.functional.layer_norm(x.real, ns, eps=eps)
    zi = torch.nn.functional.layer_norm(x.imag, ns, eps=eps)
    yr = weight[0, 0] * zr + weight[0, 1] * zi + bias[0]
    yi = weight[1, 0] * zr + weight[1, 1] * zi + bias[1]
    return torch.complex(yr, yi)


def module_case(module, prefix):
    """Parameters of `module` randomised (float32 values), named `<prefix>.<param>`."""
    module = module.to(torch.float64)
    params = {}
    for name, p in module.named_parameters():
        with torch.no_grad():
            p.copy_(rand(p.shape, False))
        params[f"{prefix}.{name}"] = p
    return module, params


CASES = []


def case(name, dtype, dims, call, fn_and_params):
    CASES.append((name, dtype, dims, call, fn_and_params))


# `call` is the .cvnn stage applied to input `x`; the binding is `y`, so parameters are named
# `y.<op>_0.<param>`, which are complextorch's / torch.nn's names under that prefix.
case("layernorm_whitening", "c64", [3, 4], "layernorm",
     lambda: module_case(ctnn.LayerNorm(4), "y.layernorm_0"))
case("layernorm_whitening_axes2", "c64", [3, 4], "layernorm(axes = 2, kind = whitening, eps = 1e-3)",
     lambda: module_case(ctnn.LayerNorm([3, 4], eps=1e-3), "y.layernorm_0"))
case("layernorm_whitening_no_affine", "c64", [2, 3, 4], "layernorm(axes = 2, affine = false)",
     lambda: module_case(ctnn.LayerNorm([3, 4], elementwise_affine=False), "y.layernorm_0"))
case("layernorm_real_axes2", "f32", [3, 4], "layernorm(axes = 2)",
     lambda: module_case(torch.nn.LayerNorm([3, 4]), "y.layernorm_0"))
case("rmsnorm", "c64", [3, 4], "rmsnorm",
     lambda: module_case(ctnn.RMSNorm(4), "y.rmsnorm_0"))
case("rmsnorm_axes2", "c64", [3, 4], "rmsnorm(axes = 2, eps = 1e-3)",
     lambda: module_case(ctnn.RMSNorm([3, 4], eps=1e-3), "y.rmsnorm_0"))
case("rmsnorm_real", "f32", [3, 4], "rmsnorm",
     lambda: module_case(torch.nn.RMSNorm(4, eps=1e-5), "y.rmsnorm_0"))


def naive():
    w = rand((2, 2, 4), False).requires_grad_()
    b = rand((2, 4), False).requires_grad_()
    return (lambda x: naive_layer_norm(x, (4,), w, b, 1e-5)), {
        "y.layernorm_0.weight": w, "y.layernorm_0.bias": b}


case("layernorm_naive", "c64", [3, 4], "layernorm(kind = naive)", naive)


def fn(f):
    return lambda: (f, {})


case("softmax", "f32", [3, 5], "softmax", fn(lambda x: torch.softmax(x, -1)))
case("softmax_axis1", "f32", [3, 5], "softmax(axis = 1)", fn(lambda x: torch.softmax(x, 1)))
case("log_softmax", "f32", [3, 5], "log_softmax", fn(lambda x: torch.log_softmax(x, -1)))
case("log_softmax_axis1", "f32", [3, 5], "log_softmax(axis = -2)", fn(lambda x: torch.log_softmax(x, -2)))
case("mean_tuple", "c64", [3, 5], "mean(axis = (1, -1))", fn(lambda x: x.mean(dim=(1, 2))))
case("sum_keepdim", "c64", [3, 5], "sum(axis = 1, keepdim = true)", fn(lambda x: x.sum(dim=1, keepdim=True)))
case("mean_batch", "f32", [3], "mean(axis = 0)", fn(lambda x: x.mean(dim=0)))


def to_np(t, complex_):
    t = t.detach()
    return t.numpy().astype(np.complex128 if complex_ else np.float64)


def main():
    index = []
    for name, dtype, dims, call, make in CASES:
        cplx = dtype == "c64"
        f, params = make()
        if isinstance(f, torch.nn.Module):
            module = f
            f = module
        x = rand([BATCH, *dims], cplx).requires_grad_()
        y = f(x)
        w = rand(y.shape, y.is_complex())
        loss = (w.conj() * y).real.sum() if y.is_complex() else (w * y).sum()
        leaves = [x, *params.values()]
        grads = torch.autograd.grad(loss, leaves)
        arrays = {
            "x": to_np(x, cplx).astype(np.complex64 if cplx else np.float32),
            "probe": to_np(w, y.is_complex()).astype(np.complex64 if y.is_complex() else np.float32),
            "y": to_np(y, y.is_complex()),
            "grad.x": to_np(grads[0], cplx),
        }
        for (pname, p), g in zip(params.items(), grads[1:]):
            arrays[f"param.{pname}"] = to_np(p, False).astype(np.float32)
            arrays[f"grad.{pname}"] = to_np(g, False)
        np.savez(os.path.join(HERE, f"{name}.npz"), **arrays)
        index.append({"name": name, "dtype": dtype, "dims": dims, "call": call,
                      "params": list(params.keys())})
    with open(os.path.join(HERE, "cases.json"), "w") as fh:
        json.dump(index, fh, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    main()
