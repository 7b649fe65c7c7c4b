"""A plain PyTorch native-complex ViT of the shape of examples/vit_sar.cvnn, one JSON line.

    python3 bench/vit/torch_vit.py --tokens 256 --batch 128 --precision fp32 [--compile]

complex64 tensors and torch.nn's complex Linear/Conv2d throughout: conv patch embedding
(4×4, stride 4) plus a learned positional embedding, 12 pre-norm layers (x + attn(norm(x)),
then x + ffn(x) with ffn = norm, linear, CGELU, norm, linear, CGELU), per-sample RMSNorm
with a 2×2 affine (complextorch 2.1.1's definition), attention softmax(Re(q·kᴴ)/√d)·v
(torchcvnn's, without q/k norms), final norm, mean over tokens, complex linear, |·|,
cross-entropy, Adam. `--compile` wraps the model in torch.compile.
"""

import math
import sys

import torch
import torch.nn.functional as F
from torch import nn

from common import PATCH, emit, image_side, parser
from torch_common import run

C64 = torch.complex64


class RMSNorm(nn.Module):
    """x / sqrt(mean |x|² + eps) over the last axis, then a 2×2 real affine on (re, im)."""

    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter((torch.eye(2) / math.sqrt(2)).view(2, 2, 1).repeat(1, 1, d))

    def forward(self, x):
        r = torch.rsqrt((x.real.square() + x.imag.square()).mean(-1, keepdim=True) + self.eps)
        re, im = x.real * r, x.imag * r
        w = self.weight
        return torch.complex(w[0, 0] * re + w[0, 1] * im, w[1, 0] * re + w[1, 1] * im)


def cgelu(x):
    return torch.complex(F.gelu(x.real), F.gelu(x.imag))


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.in_proj = nn.Linear(dim, 3 * dim, dtype=C64)
        self.out_proj = nn.Linear(dim, dim, dtype=C64)

    def forward(self, x):
        b, t, e = x.shape
        h, d = self.heads, e // self.heads
        q, k, v = self.in_proj(x).view(b, t, 3, h, d).permute(2, 0, 3, 1, 4)  # 3 × [B, H, T, D]
        s = (q @ k.conj().transpose(-2, -1)).real * (1.0 / math.sqrt(d))  # [B, H, T, T] real
        p = torch.softmax(s, dim=-1)
        o = p.to(C64) @ v  # [B, H, T, D]
        return self.out_proj(o.transpose(1, 2).reshape(b, t, e))


class Layer(nn.Module):
    def __init__(self, dim: int, heads: int, mlp: int):
        super().__init__()
        self.norm1 = RMSNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = RMSNorm(dim)
        self.fc1 = nn.Linear(dim, mlp, dtype=C64)
        self.norm3 = RMSNorm(mlp)
        self.fc2 = nn.Linear(mlp, dim, dtype=C64)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        h = cgelu(self.fc1(self.norm2(x)))
        return x + cgelu(self.fc2(self.norm3(h)))


class Vit(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.embed = nn.Conv2d(1, args.dim, PATCH, stride=PATCH, dtype=C64)
        self.pos = nn.Parameter(torch.randn(1, args.tokens, args.dim, dtype=C64) * 0.02)
        self.layers = nn.Sequential(*[Layer(args.dim, args.heads, args.mlp) for _ in range(args.layers)])
        self.norm = RMSNorm(args.dim)
        self.head = nn.Linear(args.dim, args.classes, dtype=C64)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2) + self.pos
        x = self.norm(self.layers(x))
        return self.head(x.mean(dim=1)).abs()


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = p.parse_args()
    image_side(args.tokens)

    def build():
        net = Vit(args).to(args.device)
        return net, (torch.compile(net) if args.compile else net)

    r = run("pytorch", "torch_vit" + ("_compile" if args.compile else ""), args, build)
    emit(r)
    return 0 if r["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
