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

def combine(mode, r, i):
    if mode == "split_complex":
        return torch.complex(r, i)
    return r.type(C64) + 1j * i.type(C64)

class CConv(nn.Module):
    def __init__(s, cin, cout, mode):
        super().__init__(); s.mode = mode
        s.r = nn.Conv2d(cin, cout, 3, padding=1, bias=False); s.i = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
    def forward(s, x):
        xr, xi = x.real, x.imag
        return combine(s.mode, s.r(xr) - s.i(xi), s.r(xi) + s.i(xr))

class CLin(nn.Module):
    def __init__(s, fin, fout, mode):
        super().__init__(); s.mode = mode
        s.r = nn.Linear(fin, fout); s.i = nn.Linear(fin, fout)
    def forward(s, x):
        xr, xi = x.real, x.imag
        return combine(s.mode, s.r(xr) - s.i(xi), s.r(xi) + s.i(xr))

class CBN(nn.Module):  # naive complex BN: BN on real and imag parts separately
    def __init__(s, c, mode):
        super().__init__(); s.mode = mode if mode != "native" else "split_complex"
        s.r = nn.BatchNorm2d(c); s.i = nn.BatchNorm2d(c)
    def forward(s, x):
        return combine(s.mode, s.r(x.real), s.i(x.imag))

def crelu(x, mode):
    m = mode if mode != "native" else "split_complex"
    return combine(m, F.relu(x.real), F.relu(x.imag))

class Net(nn.Module):
    def __init__(s, mode, ch=(1, 32, 64, 64), hw=64, classes=10):
        super().__init__(); s.mode = mode
        if mode == "native":
            s.convs = nn.ModuleList([nn.Conv2d(a, b, 3, padding=1, bias=False, dtype=C64) for a, b in zip(ch[:-1], ch[1:])])
            s.fc = nn.Linear(ch[-1] * (hw // 4) ** 2, classes, dtype=C64)
        else:
            s.convs = nn.ModuleList([CConv(a, b, mode) for a, b in zip(ch[:-1], ch[1:])])
            s.fc = CLin(ch[-1] * (hw // 4) ** 2, classes, mode)
        s.bns = nn.ModuleList([CBN(b, mode) for b in ch[1:]])
    def forward(s, x):
        for k, (cv, bn) in enumerate(zip(s.convs, s.bns)):
            x = crelu(bn(cv(x)), s.mode)
            if k < 2:  # 2x2 average pool on complex = pool on both parts
                x = F.avg_pool2d(torch.view_as_real(x).permute(0, 4, 1, 2, 3).flatten(1, 2), 2)
                b, c2, h, w = x.shape
                x = torch.view_as_complex(x.view(b, 2, c2 // 2, h, w).permute(0, 2, 3, 4, 1).contiguous())
        return s.fc(x.flatten(1)).abs()

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
