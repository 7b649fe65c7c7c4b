"""cuBLAS (through torch.matmul on complex64, i.e. cublasCgemm) on the matmul shapes of one
seed_cnn training step at batch 1024, to set against cvc's generated matmul kernels (their
times are in the per-kernel profile of `bench_seed_cnn`). Prints one JSON line per shape."""
import json
import torch

torch.backends.cuda.matmul.allow_tf32 = False
dev = "cuda"
shapes = {  # (m, k, n): linear forward, weight gradient, input gradient
    "linear forward [1024,16384]x[16384,10]": (1024, 16384, 10),
    "weight grad [16384,1024]x[1024,10]": (16384, 1024, 10),
    "input grad [1024,10]x[10,16384]": (1024, 10, 16384),
}
for name, (m, k, n) in shapes.items():
    a = torch.randn(m, k, dtype=torch.complex64, device=dev)
    b = torch.randn(k, n, dtype=torch.complex64, device=dev)
    for _ in range(5):
        a @ b
    torch.cuda.synchronize()
    times = []
    for _ in range(50):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    print(json.dumps(dict(shape=name, cublas_ms=times[len(times) // 2])))
