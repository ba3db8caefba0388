"""``collc.set_algorithm``: a user's ``.coll`` file runs a collective, verified before its first call.

``algorithm.py DIR`` (under torchrun, ``COLLC_DEBUG=INFO``): writes a copy of the library's ring AllReduce as
``DIR/my_ring.coll`` and a broken one, checks that the broken one raises a ``ValueError`` carrying the compiler's
diagnostic (file, line, counterexample) at ``set_algorithm``, not at a call, then runs all-reduces with
``my_ring.coll`` and checks their results. ``tests/torch.rs`` checks that the INFO lines name ``my_ring.coll`` as
the algorithm of those calls.
"""

import os
import sys

import collc
import torch
import torch.distributed as dist

folder = sys.argv[1]
dist.init_process_group("collc")
rank, size = dist.get_rank(), dist.get_world_size()

ring = os.path.join(folder, "my_ring.coll")
broken = os.path.join(folder, "broken.coll")
if rank == 0:
    library_ring = os.path.join(os.path.dirname(__file__), "..", "..", "algorithms", "allreduce", "ring.coll")
    with open(library_ring) as f:
        text = f.read()
    with open(ring, "w") as f:
        f.write(text)
    # The ring with its all-gather one step short: it parses, and does not verify.
    gather = "passes it on.\n    for s in 0..p-"
    assert text.count(gather + "1 {") == 1
    with open(broken, "w") as f:
        f.write(text.replace("algorithm ring", "algorithm broken").replace(gather + "1 {", gather + "2 {"))
dist.barrier()

try:
    collc.set_algorithm("allreduce", broken)
except ValueError as e:
    message = str(e)
    if rank == 0:
        print(message, flush=True)
    for words in ("broken.coll:3", "collc::verify::postcondition", "counterexample"):
        assert words in message, f"the diagnostic does not say `{words}`: {message}"
else:
    raise AssertionError("a broken .coll file was accepted")

collc.set_algorithm("all_reduce", ring)
assert collc.algorithm_of("allreduce") == ring
for n in (1, 1000, 100000):
    t = torch.full((n,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((n,), float(size * (size + 1) // 2))), t[:4]
dist.barrier()
if rank == 0:
    print(f"algorithm: a broken file refused at set_algorithm; {ring} ran the all-reduces", flush=True)
dist.destroy_process_group()
