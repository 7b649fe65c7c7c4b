"""Anchor benchmark: the seed's CVNN trade-off in PyTorch, measured side by side.

Variants of one complex CNN (CConv-CBN-CReLU x3, pool, CLinear, magnitude, CE loss):
  split_complex : real/imag computed separately, combined with torch.complex (seed's first version)
  split_cast    : same, combined as out_r.type(c64) + 1j*out_i.type(c64) (seed's fix)
  native        : complex-dtype Conv2d/Linear weights (PyTorch's own complex kernels)
  *_compile     : torch.compile of the variant, where it works
Prints peak memory and median step time per variant and batch size.

cvc's copy of ../shared/reference/seed_cvnn.py with the device as a parameter (`--device cpu`,
the default here): on the CPU the peak is the process's peak RSS (ru_maxrss), the thread count
is set by `--threads`, and each variant should run in its own process (bench/cpu_seed.sh does)
so that one variant's peak does not hide another's.
"""
import sys, time, json, resource, statistics as st
import torch, torch.nn as nn, torch.nn.functional as F

dev = "cpu"
C64 = torch.complex64

def sync():
    if dev.startswith("cuda"): torch.cuda.synchronize()

def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

# The network itself is the reference's own (bench/seed_cvnn.py, a copy of
# ../shared/reference/seed_cvnn.py), so both benchmarks measure exactly one model.
from seed_cvnn import Net

def bench(mode, batch, compile_=False, steps=20, hw=64):
    torch.manual_seed(0)
    net = Net(mode, hw=hw).to(dev)
    fwd = torch.compile(net) if compile_ else net
    opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    x = torch.randn(batch, 1, hw, hw, dtype=C64, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(fwd(x), y)
        loss.backward(); opt.step(); return loss
    for _ in range(3): step()
    sync()
    if dev.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated() / 2**20
    else:
        base = peak_rss_mib()
    ts = []
    for _ in range(steps):
        t0 = time.perf_counter(); step(); sync(); ts.append((time.perf_counter() - t0) * 1e3)
    peak = torch.cuda.max_memory_allocated() / 2**20 if dev.startswith("cuda") else peak_rss_mib()
    return dict(mode=mode + ("_compile" if compile_ else ""), batch=batch, peak_mib=peak,
                steady_mib=base, step_ms=st.median(ts), step_ms_min=min(ts))

if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="PyTorch reference for the seed CVNN: peak memory and step time per variant")
    ap.add_argument("--batch", type=int, nargs="+", default=[1024])
    ap.add_argument("--numerics", choices=["fp32", "tf32"], default="fp32", help="fp32 disables TF32 in cuDNN and cuBLAS")
    ap.add_argument("--variants", nargs="+", default=["split_complex", "split_cast", "native"])
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile variants")
    ap.add_argument("--compile-only", action="store_true", help="run only the torch.compile variants")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads on the CPU")
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    dev = a.device
    tf32 = a.numerics == "tf32"
    torch.backends.cudnn.allow_tf32 = tf32; torch.backends.cuda.matmul.allow_tf32 = tf32
    if dev == "cpu":
        torch.set_num_threads(a.threads)
        name = "cpu (%d threads)" % torch.get_num_threads()
    else:
        name = torch.cuda.get_device_name(0)
    print(torch.__version__, name, a.numerics, flush=True)
    rows = []
    for batch in a.batch:
        for mode in a.variants:
            for comp in ((False,) if a.no_compile else (True,) if a.compile_only else (False, True)):
                try:
                    r = bench(mode, batch, comp, steps=a.steps)
                except Exception as e:  # torch.compile fails on some variants (seen: split_cast)
                    r = dict(mode=mode + ("_compile" if comp else ""), batch=batch, error=repr(e)[:200])
                rows.append(r); print(json.dumps(r), flush=True)
                if dev.startswith("cuda"): torch.cuda.empty_cache()
    print("%-22s %6s %10s %10s" % ("variant", "batch", "peak MiB", "step ms"))
    for r in rows:
        if "error" in r: print("%-22s %6d  ERROR %s" % (r["mode"], r["batch"], r["error"][:80]))
        else: print("%-22s %6d %10.1f %10.3f" % (r["mode"], r["batch"], r["peak_mib"], r["step_ms"]))
