"""Every collective of the collc backend against gloo's in the same job, under torchrun (4 ranks in CI).

Run by ``tests/torch.rs``: ``python -m torch.distributed.run --nproc-per-node 4 collectives.py``. The default group is
collc's; a gloo group over the same ranks computes what collc must. Integer-valued data is compared bit for bit (any
reduction order sums it exactly); random floats within the dtype's tolerance (collc's and gloo's algorithms add in
different orders). What gloo lacks (avg, premul_sum, uint types) is checked against the inputs all-gathered.
Prints ``collectives: N checks passed`` on rank 0; any mismatch raises, naming the case.
"""

import collc
import torch
import torch.distributed as dist

dist.init_process_group("collc")
rank, size = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
collc_group = dist.group.WORLD
assert isinstance(collc_group, collc.ProcessGroupCollc), f"the default group is {type(collc_group)}"
checks = 0

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def data(dtype, n, seed, exact):
    """This rank's input: integer-valued (exact in any order) or random normals."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype.is_floating_point and not exact:
        return torch.randn(n, generator=g, dtype=torch.float64).to(dtype)
    low, high = (0, 4) if dtype in (torch.uint8, torch.int8) else (-50, 50)
    if dtype == torch.uint8:
        low, high = 0, 8
    return torch.randint(low, high, (n,), generator=g).to(dtype)


def bits(t):
    """The tensor's bytes (so NaNs and signed zeros compare as themselves)."""
    return t.contiguous().view(torch.uint8) if t.dtype != torch.bool else t


def same(case, got, want, exact):
    global checks
    checks += 1
    if exact or not got.dtype.is_floating_point:
        if not torch.equal(bits(got), bits(want)):
            raise AssertionError(f"rank {rank}: {case}: collc {got[:8].tolist()} != {want[:8].tolist()} (bit for bit)")
        return
    tol = TOLERANCE[got.dtype]
    scale = want.double().abs().max().item() + 1
    err = (got.double() - want.double()).abs().max().item()
    if err > tol * scale * size:
        raise AssertionError(
            f"rank {rank}: {case}: collc differs from the reference by {err} (tolerance {tol * scale})"
        )


def gathered(t):
    """Every rank's ``t``, through gloo (in float64 for the references gloo cannot compute)."""
    out = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(out, t, group=gloo)
    return out


OPS = {
    "sum": dist.ReduceOp.SUM,
    "product": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
}


def reference(op, inputs, dtype):
    """op over ``inputs`` in float64 (or int64), rank order, cast back."""
    wide = [i.double() if dtype.is_floating_point else i.long() for i in inputs]
    acc = wide[0].clone()
    for w in wide[1:]:
        acc = {"sum": acc + w, "product": acc * w, "min": torch.minimum(acc, w), "max": torch.maximum(acc, w)}[op]
    return acc


# all_reduce: every op and dtype, both data kinds, sizes from one element to several tiles.
for dtype in FLOATS + INTS:
    for exact in [True, False] if dtype.is_floating_point else [True]:
        for op_name, op in OPS.items():
            if op_name == "product" and (dtype in (torch.int8, torch.uint8) or not exact):
                continue
            for n in (1, 7, 1000, 70000):
                x = data(dtype, n, n + hash(op_name) % 97, exact)
                if op_name == "product":
                    x = torch.where(x == 0, torch.ones_like(x), x.clamp(-2, 2))
                a, b = x.clone(), x.clone()
                dist.all_reduce(a, op=op)
                dist.all_reduce(b, op=op, group=gloo)
                same(f"all_reduce {op_name} {dtype} n={n} exact={exact}", a, b, exact)

# avg and premul_sum (gloo has neither): against the inputs all-gathered.
for dtype in FLOATS:
    n = 4099
    x = data(dtype, n, 5, True)
    a = x.clone()
    dist.all_reduce(a, op=dist.ReduceOp.AVG)
    want = (reference("sum", gathered(x), dtype) / size).to(dtype)
    same(f"all_reduce avg {dtype}", a, want, dtype in (torch.float32, torch.float64))
    a = x.clone()
    dist.all_reduce(a, op=dist._make_nccl_premul_sum(0.5))
    want = (reference("sum", gathered(x), dtype) * 0.5).to(dtype)
    same(f"all_reduce premul_sum {dtype}", a, want, True)

# bool: or (sum, max) and and (product, min).
x = data(torch.bool, 333, 3, True)
for op_name, op in OPS.items():
    a, b = x.clone(), x.clone()
    dist.all_reduce(a, op=op)
    want = reference("max" if op_name in ("sum", "max") else "min", gathered(x), torch.int64).bool()
    same(f"all_reduce {op_name} bool", a, want, True)

# uint32 / uint64 where this torch has them: against the gathered inputs.
for name in ("uint32", "uint64"):
    dtype = getattr(torch, name, None)
    if dtype is None:
        continue
    x = torch.randint(0, 1000, (513,), generator=torch.Generator().manual_seed(rank)).to(dtype)
    a = x.clone()
    dist.all_reduce(a)
    want = reference("sum", gathered(x.long()), torch.int64).to(dtype)
    same(f"all_reduce sum {name}", a, want, True)

for dtype in [torch.float32, torch.bfloat16, torch.int64, torch.uint8]:
    for n in (1, 1031):
        x = data(dtype, n, 11, True)
        # broadcast from every root
        for root in range(size):
            a, b = x.clone(), x.clone()
            dist.broadcast(a, root)
            dist.broadcast(b, root, group=gloo)
            same(f"broadcast root {root} {dtype} n={n}", a, b, True)
        # reduce to every root
        for root in range(size):
            a, b = x.clone(), x.clone()
            dist.reduce(a, root, op=dist.ReduceOp.SUM)
            dist.reduce(b, root, op=dist.ReduceOp.SUM, group=gloo)
            if rank == root:
                same(f"reduce root {root} {dtype} n={n}", a, b, True)
        # all_gather (list) and all_gather_into_tensor (out of place and in place)
        outs_a = [torch.empty_like(x) for _ in range(size)]
        outs_b = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(outs_a, x)
        dist.all_gather(outs_b, x, group=gloo)
        for i in range(size):
            same(f"all_gather {dtype} n={n} block {i}", outs_a[i], outs_b[i], True)
        flat = torch.empty(size * n, dtype=dtype)
        dist.all_gather_into_tensor(flat, x)
        same(f"all_gather_into_tensor {dtype} n={n}", flat, torch.cat(outs_b), True)
        flat = torch.zeros(size * n, dtype=dtype)
        flat[rank * n : (rank + 1) * n] = x
        dist.all_gather_into_tensor(flat, flat[rank * n : (rank + 1) * n])
        same(f"all_gather_into_tensor in place {dtype} n={n}", flat, torch.cat(outs_b), True)
        # reduce_scatter (list) and reduce_scatter_tensor
        big = data(dtype, size * n, 13, True)
        # (gloo has no reduce_scatter: the reference sums the inputs all-gathered, exact on integer values)
        a = torch.empty_like(x)
        b = reference("sum", gathered(big), dtype).to(dtype).chunk(size)[rank]
        dist.reduce_scatter(a, list(big.chunk(size)))
        same(f"reduce_scatter {dtype} n={n}", a, b, True)
        a = torch.empty_like(x)
        dist.reduce_scatter_tensor(a, big)
        same(f"reduce_scatter_tensor {dtype} n={n}", a, b, True)
        # gather and scatter at every root
        for root in range(size):
            ga = [torch.empty_like(x) for _ in range(size)] if rank == root else None
            gb = [torch.empty_like(x) for _ in range(size)] if rank == root else None
            dist.gather(x, ga, dst=root)
            dist.gather(x, gb, dst=root, group=gloo)
            if rank == root:
                for i in range(size):
                    same(f"gather root {root} {dtype} n={n} block {i}", ga[i], gb[i], True)
            if hasattr(dist, "gather_single"):  # torch >= 2.11: the root's output one flat tensor
                flat = torch.empty(size * n, dtype=dtype) if rank == root else None
                dist.gather_single(x, flat, dst=root)
                if rank == root:
                    same(f"gather_single root {root} {dtype} n={n}", flat, torch.cat(gb), True)
            parts = list(big.chunk(size)) if rank == root else None
            a, b = torch.empty_like(x), torch.empty_like(x)
            dist.scatter(a, parts, src=root)
            dist.scatter(b, [p.clone() for p in parts] if parts else None, src=root, group=gloo)
            same(f"scatter root {root} {dtype} n={n}", a, b, True)
        # all_to_all_single and all_to_all (even splits)
        a, b = torch.empty_like(big), torch.empty_like(big)
        dist.all_to_all_single(a, big)
        dist.all_to_all_single(b, big, group=gloo)
        same(f"all_to_all_single {dtype} n={n}", a, b, True)
        outs = [torch.empty_like(x) for _ in range(size)]
        dist.all_to_all(outs, list(big.chunk(size)))
        same(f"all_to_all {dtype} n={n}", torch.cat(outs), b, True)

# send/recv: a ring in both directions at once, with isend/irecv, then blocking send/recv pairs.
x = data(torch.float32, 4097, 17, False)
for shift in (1, size - 1):
    dst, src = (rank + shift) % size, (rank - shift) % size
    got = torch.empty_like(x)
    works = [dist.irecv(got, src), dist.isend(x, dst)]
    for w in works:
        w.wait()
    same(f"isend/irecv shift {shift}", got, gathered(x)[src], True)
if rank % 2 == 0:
    dist.send(x, rank + 1)
    got = torch.empty_like(x)
    dist.recv(got, rank + 1)
    same("send then recv", got, gathered(x)[rank + 1], True)
else:
    got = torch.empty_like(x)
    dist.recv(got, rank - 1)
    dist.send(x, rank - 1)
    same("recv then send", got, gathered(x)[rank - 1], True)

# async_op: several calls in flight, waited in reverse.
xs = [data(torch.float32, 100 * (i + 1), 19 + i, True) for i in range(4)]
works = [dist.all_reduce(x, async_op=True) for x in xs]
for w in reversed(works):
    w.wait()
    assert w.is_completed()
for i, x in enumerate(xs):
    same(
        f"async all_reduce {i}",
        x,
        reference("sum", gathered(data(torch.float32, 100 * (i + 1), 19 + i, True)), torch.float32).float(),
        True,
    )
fut = dist.all_reduce(torch.ones(8), async_op=True).get_future()
assert torch.equal(fut.wait()[0], torch.full((8,), float(size))), fut.wait()

# a non-contiguous tensor is copied in and the result copied back.
m = data(torch.float32, 64, 23, True).reshape(8, 8)
a, b = m.t().clone(), m.t()
dist.all_reduce(b)
assert not b.is_contiguous()
dist.all_reduce(a, group=gloo)
same("all_reduce non-contiguous", b, a, True)

# new_group: the even ranks and the odd ranks, each its own collc communicator.
for members in ([r for r in range(size) if r % 2 == 0], [r for r in range(size) if r % 2 == 1]):
    sub = dist.new_group(members)
    sub_gloo = dist.new_group(members, backend="gloo")
    if rank in members:
        assert isinstance(sub, collc.ProcessGroupCollc)
        x = data(torch.float32, 999, 29, True)
        a, b = x.clone(), x.clone()
        dist.all_reduce(a, group=sub)
        dist.all_reduce(b, group=sub_gloo)
        same(f"new_group {members} all_reduce", a, b, True)
        a, b = x.clone(), x.clone()
        dist.broadcast(a, members[-1], group=sub)
        dist.broadcast(b, members[-1], group=sub_gloo)
        same(f"new_group {members} broadcast", a, b, True)

# barrier
dist.barrier()

# Clear errors: an unsupported dtype and op, uneven splits, a tensor list of the wrong length.
for bad, kind, words in (
    (lambda: dist.all_reduce(torch.ones(4, dtype=torch.int16)), TypeError, "torch.int16"),
    (lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist.ReduceOp.BAND), ValueError, "BAND"),
    (
        lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist._make_nccl_premul_sum(0.5)),
        ValueError,
        "not a whole number",
    ),
    (
        lambda: dist.all_to_all_single(
            torch.empty(size + 1), torch.ones(size + 1), [2] + [1] * (size - 2) + [0], [1] * size
        ),
        ValueError,
        "uneven",
    ),
    (lambda: dist.all_gather([torch.empty(4)] * (size - 1), torch.ones(4)), ValueError, "output tensors"),
):
    try:
        bad()
    except kind as e:
        assert words in str(e), f"rank {rank}: the error `{e}` does not say `{words}`"
        checks += 1
    else:
        raise AssertionError(f"rank {rank}: no {kind.__name__} for a call that should raise one ({words})")

dist.barrier()
if rank == 0:
    print(f"collectives: {checks} checks passed on {size} ranks over {collc_group.transport}", flush=True)
dist.destroy_process_group()
