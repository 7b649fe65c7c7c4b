"""PyTorch reference values for tests/fixtures/ok/vit_tiny.cvnn (tests/tests/torch_vit.rs).

    /work/torchenv/bin/python tests/reference/vit/make.py     # torch, torchcvnn 0.10.0, complextorch 2.1.1

Builds vit_tiny in PyTorch from torchcvnn 0.10's MultiheadAttention (norm_layer = nn.Identity:
no q/k norms, as cvc's `attention`) and complextorch 2.1.1's RMSNorm, with torch.nn's complex
Linear and Conv2d and torchcvnn's CGELU. The module tree mirrors cvc's parameter names
(`<binding>.<op>_<k>.<param>`, python/README.md), so `state_dict()` keys are cvc's names.

Writes, next to this script:
- weights.safetensors: the state dict, complex tensors as `view_as_real` f32 `[..., 2]`, listed
  in the `cvc.complex` metadata entry (cvc's checkpoint format, runtime/src/checkpoint.rs);
- data.npz: one batch, `image` complex64 [4, 1, 16, 16] and `label` int32 [4];
- expected.safetensors: `logits` [4, 4], `loss` [] and `grad.<name>` for every parameter
  (PyTorch's `.grad`, the conjugate-Wirtinger convention cvc uses), same layout.

The weights are random (not the default init: norm weights, biases and the positional
embedding are perturbed so that every gradient path is exercised), rounded to f32 once; the
forward and backward passes run in float64/complex128 on those f32 values, so the expected
values carry only f32 storage rounding (relative ~6e-8).
"""

import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

import complextorch.nn as ct_nn
import torchcvnn.nn as c_nn

HERE = os.path.dirname(os.path.abspath(__file__))
BATCH, SIZE, PATCH, DIM, HEADS, MLP, CLASSES, LAYERS = 4, 16, 4, 16, 2, 32, 4, 2
TOKENS = (SIZE // PATCH) ** 2
DT = torch.complex128


class Tokens(nn.Module):
    """Binding `tokens`: conv patch embedding, then [B, C, h, w] → [B, h·w, C]."""

    def __init__(self):
        super().__init__()
        self.conv2d_0 = nn.Conv2d(1, DIM, PATCH, stride=PATCH, dtype=DT)

    def forward(self, x):
        y = self.conv2d_0(x)
        return y.reshape(y.shape[0], DIM, TOKENS).transpose(1, 2)


class Attn(nn.Module):
    """Block `attn`: rmsnorm, then torchcvnn self-attention (batch first, no q/k norms)."""

    def __init__(self):
        super().__init__()
        self.rmsnorm_0 = ct_nn.RMSNorm(DIM)
        self.attention_0 = c_nn.MultiheadAttention(
            DIM, HEADS, norm_layer=nn.Identity, batch_first=True, dtype=DT
        )

    def forward(self, x):
        h = self.rmsnorm_0(x)
        return self.attention_0(h, h, h, need_weights=False)


class Mlp(nn.Module):
    """Block `mlp`: torchcvnn ViTLayer's ffn (norm, linear, CGELU, norm, linear, CGELU)."""

    def __init__(self):
        super().__init__()
        self.rmsnorm_0 = ct_nn.RMSNorm(DIM)
        self.linear_0 = nn.Linear(DIM, MLP, dtype=DT)
        self.cgelu_0 = c_nn.CGELU()
        self.rmsnorm_1 = ct_nn.RMSNorm(MLP)
        self.linear_1 = nn.Linear(MLP, DIM, dtype=DT)
        self.cgelu_1 = c_nn.CGELU()

    def forward(self, x):
        x = self.cgelu_0(self.linear_0(self.rmsnorm_0(x)))
        return self.cgelu_1(self.linear_1(self.rmsnorm_1(x)))


class Head(nn.Module):
    """Binding `logits`: final norm, mean over tokens, complex linear, magnitude."""

    def __init__(self):
        super().__init__()
        self.rmsnorm_0 = ct_nn.RMSNorm(DIM)
        self.linear_0 = nn.Linear(DIM, CLASSES, dtype=DT)

    def forward(self, x):
        return self.linear_0(self.rmsnorm_0(x).mean(dim=1)).abs()


class VitTiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.pos = nn.Parameter(torch.zeros(1, TOKENS, DIM, dtype=DT))
        self.tokens = Tokens()
        for l in range(LAYERS):
            setattr(self, f"a{l}", Attn())
            setattr(self, f"m{l}", Mlp())
        self.logits = Head()

    def forward(self, image):
        x = self.tokens(image) + self.pos
        for l in range(LAYERS):
            x = x + getattr(self, f"a{l}")(x)
            x = x + getattr(self, f"m{l}")(x)
        return self.logits(x)


def randomise(net: VitTiny, g: torch.Generator):
    """Default init for the weight matrices, random values for everything a default init sets
    to a constant (so that a swapped or ignored parameter changes the result)."""

    def cn(shape, std):
        z = torch.randn(*shape, 2, generator=g, dtype=torch.float64) * (std / math.sqrt(2))
        return torch.view_as_complex(z)

    with torch.no_grad():
        net.pos.copy_(cn(net.pos.shape, 0.3))
        for name, p in net.named_parameters():
            if name.endswith("rmsnorm_0.weight") or name.endswith("rmsnorm_1.weight"):
                eye = torch.eye(2, dtype=p.dtype).view(2, 2, 1) / math.sqrt(2)
                p.copy_(eye + 0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            elif name.endswith("in_proj_bias") or name.endswith("out_proj.bias"):
                p.copy_(cn(p.shape, 0.2))


def f32_rounded(net: nn.Module):
    """Rounds every parameter to f32 storage (complex64 / float32) in place."""
    with torch.no_grad():
        for p in net.parameters():
            if p.is_complex():
                p.copy_(p.to(torch.complex64).to(p.dtype))
            else:
                p.copy_(p.to(torch.float32).to(p.dtype))


def as_stored(t: torch.Tensor):
    """A tensor in cvc's checkpoint layout (f32; complex as [..., 2]) and whether it is complex."""
    t = t.detach()
    if t.is_complex():
        return torch.view_as_real(t.to(torch.complex64)).contiguous(), True
    return t.to(torch.float32).contiguous(), False


def save(path, tensors: dict):
    out, complex_names = {}, []
    for k, v in tensors.items():
        out[k], c = as_stored(v)
        if c:
            complex_names.append(k)
    save_file(out, path, metadata={"cvc.complex": ",".join(complex_names), "made_by": "tests/reference/vit/make.py"})


def main() -> int:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    net = VitTiny()
    randomise(net, g)
    f32_rounded(net)

    rng = np.random.default_rng(2)
    image = ((rng.standard_normal((BATCH, 1, SIZE, SIZE)) + 1j * rng.standard_normal((BATCH, 1, SIZE, SIZE))) / math.sqrt(2)).astype(np.complex64)
    label = rng.integers(0, CLASSES, BATCH).astype(np.int32)

    logits = net(torch.from_numpy(image).to(DT))
    loss = F.cross_entropy(logits, torch.from_numpy(label).long())
    loss.backward()

    save(os.path.join(HERE, "weights.safetensors"), dict(net.state_dict()))
    np.savez(os.path.join(HERE, "data.npz"), image=image, label=label)
    expected = {"logits": logits, "loss": loss.reshape(())}
    for name, p in net.named_parameters():
        expected[f"grad.{name}"] = p.grad
    save(os.path.join(HERE, "expected.safetensors"), expected)

    shapes = {k: list(v.shape) + (["c64"] if v.is_complex() else ["f32"]) for k, v in net.state_dict().items()}
    print(json.dumps({"loss": loss.item(), "logits": logits.detach().numpy().round(5).tolist(), "parameters": shapes}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
