"""The ViT of examples/vit_sar.cvnn in JAX under jax.jit, complex64 end to end; one JSON line.

    python3 bench/vit/jax_vit.py --tokens 256 --batch 128 --precision fp32

Same network as bench/vit/torch_vit.py (conv patch embedding plus positions, 12 pre-norm
layers of per-sample RMSNorm, softmax(Re(q·kᴴ)/√d)·v attention and a CGELU MLP, final norm,
mean over tokens, complex linear, |·|, cross-entropy). The whole step (forward, backward,
Adam written out by hand: no optax needed) is one jitted function. fp32 sets the default
matmul/conv precision to "highest"; tf32 leaves XLA's default (TF32 on NVIDIA GPUs).
Peak memory: the device's peak_bytes_in_use (GPU) or the process's peak RSS (CPU).
"""

import math
import os
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp
from jax import lax

from common import PATCH, cpu_peak_bytes, emit, image_side, parser, result, timed

C64 = jnp.complex64


def cnormal(key, shape, std):
    kr, ki = jax.random.split(key)
    s = std / math.sqrt(2)
    return (jax.random.normal(kr, shape) * s + 1j * jax.random.normal(ki, shape) * s).astype(C64)


def linear(key, fin, fout):
    # PyTorch's default bound 1/sqrt(fin) as a complex normal of that scale.
    return {"w": cnormal(key, (fout, fin), 1 / math.sqrt(fin)), "b": jnp.zeros((fout,), C64)}


def norm(d):
    return jnp.broadcast_to((jnp.eye(2) / math.sqrt(2))[:, :, None], (2, 2, d)).astype(jnp.float32)


def init(key, a):
    ks = iter(jax.random.split(key, 4 + 4 * a.layers))
    p = {
        "embed_w": cnormal(next(ks), (a.dim, 1, PATCH, PATCH), 1 / PATCH),
        "embed_b": jnp.zeros((a.dim,), C64),
        "pos": cnormal(next(ks), (1, a.tokens, a.dim), 0.02),
        "norm": norm(a.dim),
        "head": linear(next(ks), a.dim, a.classes),
        "layers": [],
    }
    for _ in range(a.layers):
        p["layers"].append({
            "n1": norm(a.dim), "in": linear(next(ks), a.dim, 3 * a.dim), "out": linear(next(ks), a.dim, a.dim),
            "n2": norm(a.dim), "fc1": linear(next(ks), a.dim, a.mlp), "n3": norm(a.mlp),
            "fc2": linear(next(ks), a.mlp, a.dim),
        })
    return p


def apply_linear(l, x):
    return x @ l["w"].T + l["b"]


def rmsnorm(w, x, eps=1e-5):
    r = lax.rsqrt(jnp.mean(x.real ** 2 + x.imag ** 2, axis=-1, keepdims=True) + eps)
    re, im = x.real * r, x.imag * r
    return lax.complex(w[0, 0] * re + w[0, 1] * im, w[1, 0] * re + w[1, 1] * im)


def cgelu(x):
    return lax.complex(jax.nn.gelu(x.real, approximate=False), jax.nn.gelu(x.imag, approximate=False))


def attention(l, x, heads):
    b, t, e = x.shape
    d = e // heads
    qkv = apply_linear(l["in"], x).reshape(b, t, 3, heads, d).transpose(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    s = jnp.einsum("bhtd,bhsd->bhts", q, jnp.conj(k)).real * (1.0 / math.sqrt(d))
    pr = jax.nn.softmax(s, axis=-1)
    o = jnp.einsum("bhts,bhsd->bhtd", pr.astype(C64), v)
    return apply_linear(l["out"], o.transpose(0, 2, 1, 3).reshape(b, t, e))


def forward(p, x, heads):
    y = lax.conv_general_dilated(x, p["embed_w"], (PATCH, PATCH), "VALID") + p["embed_b"][None, :, None, None]
    b, c = y.shape[:2]
    h = y.reshape(b, c, -1).transpose(0, 2, 1) + p["pos"]
    for l in p["layers"]:
        h = h + attention(l, rmsnorm(l["n1"], h), heads)
        f = cgelu(apply_linear(l["fc1"], rmsnorm(l["n2"], h)))
        h = h + cgelu(apply_linear(l["fc2"], rmsnorm(l["n3"], f)))
    h = rmsnorm(p["norm"], h).mean(axis=1)
    return jnp.abs(apply_linear(p["head"], h))


def loss_fn(p, x, y, heads):
    logits = forward(p, x, heads)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))


def adam_update(p, g, m, v, t, lr=1e-4, b1=0.9, b2=0.999, eps=1e-8):
    """PyTorch's Adam on complex parameters: the real and imaginary parts as separate reals."""
    g = jnp.conj(g) if jnp.iscomplexobj(g) else g  # JAX's gradient is the conjugate of PyTorch's
    m = b1 * m + (1 - b1) * g
    if jnp.iscomplexobj(g):
        v = b2 * v + (1 - b2) * lax.complex(g.real ** 2, g.imag ** 2)
        mh, vh = m / (1 - b1 ** t), v / (1 - b2 ** t)
        step = lax.complex(mh.real / (jnp.sqrt(vh.real) + eps), mh.imag / (jnp.sqrt(vh.imag) + eps))
    else:
        v = b2 * v + (1 - b2) * g * g
        mh, vh = m / (1 - b1 ** t), v / (1 - b2 ** t)
        step = mh / (jnp.sqrt(vh) + eps)
    return p - lr * step, m, v


def make_step(heads):
    @jax.jit
    def step(p, m, v, t, x, y):
        l, g = jax.value_and_grad(loss_fn)(p, x, y, heads)
        out = jax.tree.map(lambda p, g, m, v: adam_update(p, g, m, v, t), p, g, m, v)
        is_triple = lambda z: isinstance(z, tuple)
        p = jax.tree.map(lambda z: z[0], out, is_leaf=is_triple)
        m = jax.tree.map(lambda z: z[1], out, is_leaf=is_triple)
        v = jax.tree.map(lambda z: z[2], out, is_leaf=is_triple)
        return p, m, v, l

    return step


def main() -> int:
    a = parser(__doc__.splitlines()[0]).parse_args()
    side = image_side(a.tokens)
    if a.precision == "fp32":
        jax.config.update("jax_default_matmul_precision", "highest")
    if a.device == "cpu":
        jax.config.update("jax_platforms", "cpu")
    try:
        dev = jax.devices()[0]
        key = jax.random.PRNGKey(0)
        p = init(key, a)
        m = jax.tree.map(jnp.zeros_like, p)
        v = jax.tree.map(jnp.zeros_like, p)
        x = cnormal(jax.random.PRNGKey(1), (a.batch, 1, side, side), 1.0)
        y = jax.random.randint(jax.random.PRNGKey(2), (a.batch,), 0, a.classes)
        step = make_step(a.heads)
        t = 0
        for _ in range(a.warmup):
            t += 1
            p, m, v, l = step(p, m, v, jnp.float32(t), x, y)
        jax.block_until_ready(l)
        times = []
        for _ in range(a.steps):
            t += 1
            t0 = time.perf_counter()
            p, m, v, l = step(p, m, v, jnp.float32(t), x, y)
            jax.block_until_ready(l)
            times.append((time.perf_counter() - t0) * 1e3)
        stats = dev.memory_stats() if dev.platform == "gpu" else None
        peak = stats.get("peak_bytes_in_use") if stats else cpu_peak_bytes()
        r = result("jax", "jax_vit_jit", a, status="ok", peak_bytes=peak, loss=float(l), jax=jax.__version__,
                   **timed(times))
    except Exception as e:
        text = f"{type(e).__name__}: {str(e)[:400]}"
        oom = "RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e).lower()
        r = result("jax", "jax_vit_jit", a, status="oom" if oom else "error", error=text)
    emit(r)
    return 0 if r["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
