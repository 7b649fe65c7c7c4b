"""torchcvnn 0.10's own `vit_t` as a complex-image classifier, one JSON line (see common.py).

    python3 bench/vit/torchcvnn_vit.py --tokens 256 --batch 128 --precision fp32

The network is torchcvnn.models.vit_t as shipped (12 layers, 3 heads, dim 192, MLP 768, its
RMSNorm, which takes statistics across batch and tokens, and its q/k norms in the attention),
with a conv patch embedder (4×4 complex conv, stride 4) plus a learned positional embedding
in front and the head of torchcvnn's ViT docstring: mean over tokens, complex Linear, Mod.
`--layers/--heads/--dim/--mlp` build c_nn.ViT with another shape (CPU smoke tests).
"""

import sys

import torch
from torch import nn

import torchcvnn.nn as c_nn
from torchcvnn.models import vit_t

from common import PATCH, emit, image_side, parser
from torch_common import run


class PatchEmbedder(nn.Module):
    def __init__(self, dim: int, tokens: int):
        super().__init__()
        self.conv = nn.Conv2d(1, dim, PATCH, stride=PATCH, dtype=torch.complex64)
        self.pos = nn.Parameter(torch.randn(1, tokens, dim, dtype=torch.complex64) * 0.02)

    def forward(self, x):
        # (B, dim, h, w) → (B, h·w, dim); contiguous because torchcvnn's norms use .view.
        return self.conv(x).flatten(2).transpose(1, 2).contiguous() + self.pos


class Classifier(nn.Module):
    def __init__(self, args):
        super().__init__()
        emb = PatchEmbedder(args.dim, args.tokens)
        vit_t_shape = (args.layers, args.heads, args.dim, args.mlp) == (12, 3, 192, 768)
        if vit_t_shape:
            self.backbone = vit_t(emb)
        else:
            self.backbone = c_nn.ViT(emb, args.layers, args.heads, args.dim, args.mlp, norm_layer=c_nn.RMSNorm)
        self.head = nn.Sequential(nn.Linear(args.dim, args.classes, dtype=torch.complex64), c_nn.Mod())

    def forward(self, x):
        return self.head(self.backbone(x).mean(dim=1))


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = p.parse_args()
    image_side(args.tokens)

    def build():
        net = Classifier(args).to(args.device)
        return net, (torch.compile(net) if args.compile else net)

    r = run("torchcvnn", "torchcvnn_vit_t" + ("_compile" if args.compile else ""), args, build)
    emit(r)
    return 0 if r["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
