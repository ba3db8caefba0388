"""A small model trained with DistributedDataParallel on collc and on gloo, from one seed, in one job.

Each rank trains two copies of the model: one whose gradients DDP averages through the collc group, one through a gloo
group over the same ranks. Both see the same batches. The loss curves must agree step by step: collc and gloo add the
ranks' gradients in different orders, so float32 rounding may differ in the last bits, and the curves are compared
within a relative tolerance (rank 0 prints the largest gap). Usage: ``ddp.py STEPS``.
"""

import sys

import collc
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
dist.init_process_group("collc")
rank, size = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))


# Buckets small enough that a step runs several all-reduces, overlapping the backward pass.
on_collc = DDP(model(), process_group=dist.group.WORLD, bucket_cap_mb=0.01)
on_gloo = DDP(model(), process_group=gloo, bucket_cap_mb=0.01)
assert isinstance(on_collc.process_group, collc.ProcessGroupCollc)
opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (on_collc, on_gloo)]

data = torch.Generator().manual_seed(1 + rank)
target_w = torch.randn(32, 1, generator=torch.Generator().manual_seed(7))
curves = ([], [])
for step in range(steps):
    x = torch.randn(16, 32, generator=data)
    y = torch.tanh(x @ target_w / 4)
    for m, opt, curve in zip((on_collc, on_gloo), opts, curves):
        opt.zero_grad()
        loss = nn.functional.mse_loss(m(x), y)
        loss.backward()
        opt.step()
        curve.append(loss.item())

# The ranks' parameters agree with each other on collc (DDP's invariant), and with gloo's run.
flat = torch.cat([p.detach().reshape(-1) for p in on_collc.parameters()])
every = [torch.empty_like(flat) for _ in range(size)]
dist.all_gather(every, flat, group=gloo)
assert all(torch.equal(every[0], e) for e in every), f"rank {rank}: the ranks' parameters differ after DDP on collc"
gap = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(*curves))
assert gap < 1e-3, f"rank {rank}: the loss curves part: largest relative gap {gap:.3g}"
first, last = sum(curves[0][:10]) / 10, sum(curves[0][-10:]) / 10
assert last < 0.2 * first, (
    f"rank {rank}: the loss did not fall (mean of the first 10 steps {first}, of the last {last})"
)
dist.barrier()
if rank == 0:
    print(
        f"ddp: {steps} steps on {size} ranks: loss {first:.4f} -> {last:.6f} (means of the first and last 10 steps) on "
        f"collc, {sum(curves[1][-10:]) / 10:.6f} on gloo; largest relative gap between the curves {gap:.2e}",
        flush=True,
    )
dist.destroy_process_group()
