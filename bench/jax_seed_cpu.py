"""JAX reference for the seed network: the whole training step under jax.jit, complex64 end to end.
Prints measured peak, XLA's own static plan (memory_analysis) and median step time.
`--fp32` sets matmul/conv precision to "highest" (no TF32).

cvc's copy of ../shared/reference/jax_seed_cvnn.py for the CPU: `--batch N` (default 64),
threads: XLA sizes its CPU thread pool from the schedulable cores, so bench/cpu_seed.sh pins
the process to 2 cores with taskset; peak = the process's peak RSS."""
import os, sys, time, json, resource, statistics as st
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
def _arg(name, default):
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default
import jax, jax.numpy as jnp
from jax import lax

def init(key, ch=(1, 32, 64, 64), hw=64, classes=10):
    ks = jax.random.split(key, 8); p = {}
    for k, (a, b) in enumerate(zip(ch[:-1], ch[1:])):
        s = (2.0 / (a * 9)) ** 0.5 / 2 ** 0.5
        p[f"w{k}"] = (jax.random.normal(ks[k], (b, a, 3, 3)) + 1j * jax.random.normal(ks[k + 3], (b, a, 3, 3))).astype(jnp.complex64) * s
        p[f"g{k}r"] = jnp.ones((b,)); p[f"g{k}i"] = jnp.ones((b,)); p[f"b{k}r"] = jnp.zeros((b,)); p[f"b{k}i"] = jnp.zeros((b,))
    fin = ch[-1] * (hw // 4) ** 2
    p["fc"] = ((jax.random.normal(ks[6], (fin, classes)) + 1j * jax.random.normal(ks[7], (fin, classes))) * (1 / fin) ** 0.5).astype(jnp.complex64)
    p["fcb"] = jnp.zeros((classes,), jnp.complex64)
    return p

def bn(x, g, b):  # naive: BN on re and im separately, batch statistics
    def one(v, g, b):
        m = v.mean((0, 2, 3), keepdims=True); var = v.var((0, 2, 3), keepdims=True)
        return (v - m) / jnp.sqrt(var + 1e-5) * g[None, :, None, None] + b[None, :, None, None]
    return one(x.real, g[0], b[0]) + 1j * one(x.imag, g[1], b[1])

def forward(p, x):
    for k in range(3):
        x = lax.conv_general_dilated(x, p[f"w{k}"], (1, 1), ((1, 1), (1, 1)))
        x = bn(x, (p[f"g{k}r"], p[f"g{k}i"]), (p[f"b{k}r"], p[f"b{k}i"]))
        x = jax.nn.relu(x.real) + 1j * jax.nn.relu(x.imag)
        if k < 2:
            b_, c, h, w = x.shape
            x = x.reshape(b_, c, h // 2, 2, w // 2, 2).mean((3, 5))
    return jnp.abs(x.reshape(x.shape[0], -1) @ p["fc"] + p["fcb"])

def loss_fn(p, x, y):
    logits = forward(p, x)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))

@jax.jit
def step(p, m, x, y):
    l, g = jax.value_and_grad(loss_fn)(p, x, y)
    g = jax.tree.map(jnp.conj, g)  # JAX returns the conjugate of PyTorch's gradient
    m = jax.tree.map(lambda m, g: 0.9 * m + g, m, g)
    p = jax.tree.map(lambda p, m: p - 1e-3 * m, p, m)
    return p, m, l

if __name__ == "__main__":
    import sys
    if "--fp32" in sys.argv: jax.config.update("jax_default_matmul_precision", "highest")
    dev = jax.devices()[0]; print(jax.__version__, dev, flush=True)
    for batch in (_arg("--batch", 64),):
        key = jax.random.PRNGKey(0); p = init(key); m = jax.tree.map(jnp.zeros_like, p)
        x = (jax.random.normal(key, (batch, 1, 64, 64)) + 1j * jax.random.normal(jax.random.PRNGKey(1), (batch, 1, 64, 64))).astype(jnp.complex64)
        y = jax.random.randint(key, (batch,), 0, 10)
        try:
            ma = step.lower(p, m, x, y).compile().memory_analysis()
            plan = dict(temp_mib=ma.temp_size_in_bytes / 2**20, arg_mib=ma.argument_size_in_bytes / 2**20, out_mib=ma.output_size_in_bytes / 2**20)
        except Exception as e:
            plan = dict(error=repr(e)[:120])
        for _ in range(3): p, m, l = step(p, m, x, y)
        l.block_until_ready(); ts = []
        for _ in range(20):
            t = time.perf_counter(); p, m, l = step(p, m, x, y); l.block_until_ready(); ts.append((time.perf_counter() - t) * 1e3)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        print(json.dumps(dict(mode="jax_jit" + ("_fp32" if "--fp32" in sys.argv else "_default"), batch=batch, peak_mib=peak, step_ms=st.median(ts), xla_plan=plan, loss=float(l))), flush=True)
