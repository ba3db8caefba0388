"""One side of bench/torch_vs_gloo.sh: ``dist.all_reduce`` timed per size on one backend, under torchrun.

``torch_allreduce.py BACKEND SIZES ITERS WARMUP``: float32 sum, in place (torch's all_reduce), each size timed over
ITERS calls (fewer for large sizes: at most 2^28 bytes moved per size) after WARMUP, the slowest rank's mean per call.
Rank 0 prints ``bytes time_us algbw_GBs busbw_GBs`` per size (busbw = algbw x 2(p-1)/p, nccl-tests' convention).
"""

import sys
import time

import torch
import torch.distributed as dist

backend, sizes, iters, warmup = (
    sys.argv[1],
    [int(s) for s in sys.argv[2].split(",")],
    int(sys.argv[3]),
    int(sys.argv[4]),
)
if backend == "collc":
    import collc  # noqa: F401 - registers the backend
dist.init_process_group(backend)
rank, p = dist.get_rank(), dist.get_world_size()
for size in sizes:
    t = torch.ones(max(size // 4, 1), dtype=torch.float32)
    n = max(5, min(iters, (1 << 28) // max(size, 1)))
    for _ in range(min(warmup, n)):
        dist.all_reduce(t)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(t)
    mean = torch.tensor([(time.perf_counter() - start) / n], dtype=torch.float64)
    dist.all_reduce(mean, op=dist.ReduceOp.MAX)
    seconds = mean.item()
    algbw = t.numel() * 4 / seconds / 1e9
    if rank == 0:
        print(f"{t.numel() * 4} {seconds * 1e6:.2f} {algbw:.3f} {algbw * 2 * (p - 1) / p:.3f}", flush=True)
dist.destroy_process_group()
