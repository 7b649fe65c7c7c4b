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

# The network and its jitted step are the reference's own (bench/jax_seed_cvnn.py, a copy of
# ../shared/reference/jax_seed_cvnn.py); JAX_PLATFORMS above keeps it on the CPU.
from jax_seed_cvnn import init, step

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
