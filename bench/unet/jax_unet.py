"""The complex U-Net of examples/polsar_unet.cvnn in JAX under jax.jit, complex64; one JSON line.

    python3 bench/unet/jax_unet.py --batch 16 [--size 64 --width 8]

Same network as bench/unet/torch_unet.py: four levels of two 3×3 complex convolutions (pad 1,
bias), each followed by a naive batchnorm (batch statistics of the real and of the imaginary
part, each with its own affine; training mode, so the running statistics, which do not
change the step's result, are left out) and CReLU; 2×2 max-magnitude pooling down, nearest
2× upsampling up, the skip joined before the upsampled path; a 1×1 convolution to the
classes, |·| as logits, per-pixel cross-entropy with ignore_index = -100. The whole step
(forward, backward, Adam written out by hand, as bench/vit/jax_vit.py) is one jitted
function. fp32 sets the default matmul/conv precision to "highest"; tf32 leaves XLA's
default. Peak memory: the device's peak_bytes_in_use (GPU) or the process's peak RSS (CPU).
"""

import math
import os
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp
from jax import lax

from common import IGNORE, check_size, cpu_peak_bytes, emit, parser, result, timed, widths

C64 = jnp.complex64


def cnormal(key, shape, std):
    kr, ki = jax.random.split(key)
    s = std / math.sqrt(2)
    return (jax.random.normal(kr, shape) * s + 1j * jax.random.normal(ki, shape) * s).astype(C64)


def conv_params(key, cin, cout, k):
    return {"w": cnormal(key, (cout, cin, k, k), math.sqrt(2.0 / (cin * k * k))), "b": jnp.zeros((cout,), C64)}


def bn_params(c):
    one, zero = jnp.ones((c,), jnp.float32), jnp.zeros((c,), jnp.float32)
    return {"g_re": one, "b_re": zero, "g_im": one, "b_im": zero}


def stage_params(key, cin, c):
    k1, k2 = jax.random.split(key)
    return {"c1": conv_params(k1, cin, c, 3), "n1": bn_params(c), "c2": conv_params(k2, c, c, 3), "n2": bn_params(c)}


def init(key, a):
    w = widths(a.width)
    ks = iter(jax.random.split(key, 2 * len(w) + 1))
    down, cin = [], a.channels
    for c in w:
        down.append(stage_params(next(ks), cin, c))
        cin = c
    up = [stage_params(next(ks), w[i] + w[i + 1], w[i]) for i in reversed(range(len(w) - 1))]
    return {"down": down, "up": up, "head": conv_params(next(ks), w[0], a.classes, 1)}


def conv(p, x):
    k = p["w"].shape[-1]
    pad = ((k // 2, k // 2), (k // 2, k // 2))
    return lax.conv_general_dilated(x, p["w"], (1, 1), pad) + p["b"][None, :, None, None]


def bn(p, x, eps=1e-5):
    def one(v, g, b):
        m = v.mean(axis=(0, 2, 3), keepdims=True)
        var = jnp.square(v - m).mean(axis=(0, 2, 3), keepdims=True)
        return (v - m) * lax.rsqrt(var + eps) * g[None, :, None, None] + b[None, :, None, None]

    return lax.complex(one(x.real, p["g_re"], p["b_re"]), one(x.imag, p["g_im"], p["b_im"]))


def crelu(x):
    return lax.complex(jax.nn.relu(x.real), jax.nn.relu(x.imag))


def stage(p, x):
    return crelu(bn(p["n2"], conv(p["c2"], crelu(bn(p["n1"], conv(p["c1"], x))))))


def maxpool_magnitude(x):
    b, c, h, w = x.shape
    win = x.reshape(b, c, h // 2, 2, w // 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(b, c, h // 2, w // 2, 4)
    i = jnp.argmax(jnp.abs(win), axis=-1)
    return jnp.take_along_axis(win, i[..., None], axis=-1)[..., 0]


def upsample(x):
    return jnp.repeat(jnp.repeat(x, 2, axis=2), 2, axis=3)


def forward(p, x):
    skips = []
    for i, s in enumerate(p["down"]):
        x = stage(s, x if i == 0 else maxpool_magnitude(x))
        skips.append(x)
    skips.pop()
    for s in p["up"]:
        x = stage(s, jnp.concatenate([skips.pop(), upsample(x)], axis=1))
    return jnp.abs(conv(p["head"], x))


def loss_fn(p, x, y):
    logp = jax.nn.log_softmax(forward(p, x), axis=1)  # [B, C, H, W]
    keep = y != IGNORE
    picked = jnp.take_along_axis(logp, jnp.where(keep, y, 0)[:, None], axis=1)[:, 0]
    return -jnp.sum(jnp.where(keep, picked, 0.0)) / jnp.sum(keep)


def adam_update(p, g, m, v, t, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
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


@jax.jit
def step(p, m, v, t, x, y):
    l, g = jax.value_and_grad(loss_fn)(p, x, y)
    out = jax.tree.map(lambda p, g, m, v: adam_update(p, g, m, v, t), p, g, m, v)
    is_triple = lambda z: isinstance(z, tuple)
    p = jax.tree.map(lambda z: z[0], out, is_leaf=is_triple)
    m = jax.tree.map(lambda z: z[1], out, is_leaf=is_triple)
    v = jax.tree.map(lambda z: z[2], out, is_leaf=is_triple)
    return p, m, v, l


def real_params(p) -> int:
    return sum(z.size * (2 if jnp.iscomplexobj(z) else 1) for z in jax.tree.leaves(p))


def main() -> int:
    a = parser(__doc__.splitlines()[0]).parse_args()
    check_size(a.size)
    if a.precision == "fp32":
        jax.config.update("jax_default_matmul_precision", "highest")
    if a.device == "cpu":
        jax.config.update("jax_platforms", "cpu")
    params = None
    try:
        dev = jax.devices()[0]
        p = init(jax.random.PRNGKey(0), a)
        params = real_params(p)
        m = jax.tree.map(jnp.zeros_like, p)
        v = jax.tree.map(jnp.zeros_like, p)
        s = a.size
        x = cnormal(jax.random.PRNGKey(1), (a.batch, a.channels, s, s), 1.0)
        y = jax.random.randint(jax.random.PRNGKey(2), (a.batch, s, s), 0, a.classes)
        y = jnp.where(jax.random.uniform(jax.random.PRNGKey(3), y.shape) < 0.1, IGNORE, y)
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
        r = result("jax", "jax_unet_jit", a, status="ok", peak_bytes=peak, params=params, loss=float(l),
                   jax=jax.__version__, **timed(times))
    except Exception as e:
        text = f"{type(e).__name__}: {str(e)[:400]}"
        oom = "RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e).lower()
        r = result("jax", "jax_unet_jit", a, status="oom" if oom else "error", params=params, error=text)
    emit(r)
    return 0 if r["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
