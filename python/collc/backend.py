"""The ``collc`` backend of torch.distributed: a ``ProcessGroup`` whose calls run on collc communicators.

Each group is one communicator (``_collc.Comm``) joined through the group's own store; its calls run in issue order
on the communicator's worker thread, without the GIL, and return works over ``torch.futures.Future``. Point-to-point
``send``/``recv`` run on a communicator per ordered pair of ranks, joined at their first message, so messages between
two ranks match in the order they were sent (``tag`` is not matched, as with NCCL).

Tensors must be contiguous CPU tensors of a dtype collc reduces (float32, float64, float16, bfloat16, int8, uint8,
int32, int64, bool; complex as torch passes it, as pairs of reals); a non-contiguous tensor is copied into a
contiguous one and the result copied back. Lists of outputs or inputs (``all_gather``, ``scatter``, ...) go through
one flat buffer, copied; ``all_gather_into_tensor``, ``reduce_scatter_tensor`` and ``all_to_all_single`` are zero-copy.
"""

import atexit
import datetime
import os
import socket
import threading
import time
import uuid
import warnings

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

from . import _collc

_DTYPES = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "half",
    torch.bfloat16: "bfloat16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.bool: "uint8",
}
for _name, _collc_name in (("uint32", "uint32"), ("uint64", "uint64")):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _collc_name

_RED = dist.ReduceOp.RedOpType
_OPS = {_RED.SUM: "sum", _RED.AVG: "avg", _RED.PRODUCT: "prod", _RED.MIN: "min", _RED.MAX: "max"}
# A bool is one byte of 0 or 1: or-ing is max, and-ing is min (as NCCL's backend does in torch).
_BOOL_OPS = {_RED.SUM: "max", _RED.MAX: "max", _RED.PRODUCT: "min", _RED.MIN: "min"}

# `set_algorithm`'s choices: collective -> (name, source), applied to every group made from then on too.
_ALGORITHMS = {}
_GROUPS = []
_LOCK = threading.Lock()


class _Work(c10d.Work):
    """A call's work over its future. (``_create_work_from_future``'s works report success from ``wait()`` even when
    their future holds an error, so a failed call would pass unseen: this one raises it.)"""

    def __init__(self, future):
        super().__init__()
        self._future = future

    def wait(self, timeout=None):
        self._future.wait()
        return True

    def is_completed(self):
        return self._future.done()

    def is_success(self):
        if not self._future.done():
            return False
        try:
            self._future.value()
        except Exception:  # noqa: BLE001 - the call failed: that is the answer
            return False
        return True

    def get_future(self):
        return self._future

    def result(self):
        return self._future.wait()


def _done(result):
    future = torch.futures.Future()
    future.set_result(result)
    return _Work(future)


def _transport(store, rank, size):
    """The transport and this rank's host's rank count: ``COLLC_TRANSPORT``, else shm when every rank of the group is on
    this host, else tcp. (The runtime refuses shm across hosts when it joins.)"""
    host = socket.gethostname()
    store.set(f"collc/host/{rank}", host)
    hosts = [store.get(f"collc/host/{r}").decode() for r in range(size)]
    local = hosts.count(host)
    chosen = os.environ.get("COLLC_TRANSPORT", "").strip().lower()
    if chosen in ("", "auto"):
        chosen = "shm" if local == size else "tcp"
    if chosen not in ("shm", "tcp"):
        raise RuntimeError(f"collc: COLLC_TRANSPORT=`{chosen}` is not a transport for CPU tensors: give shm or tcp")
    return chosen, local


def _address():
    """This host's address that the other hosts reach: ``COLLC_RENDEZVOUS_HOST``, else the address this host reaches
    ``MASTER_ADDR`` from (the route's source address), else the host name's."""
    if os.environ.get("COLLC_RENDEZVOUS_HOST"):
        return os.environ["COLLC_RENDEZVOUS_HOST"]
    master = os.environ.get("MASTER_ADDR")
    if master:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((master, int(os.environ.get("MASTER_PORT", "29500"))))
                return s.getsockname()[0]
        except OSError:
            pass
    return socket.gethostbyname(socket.gethostname())


def _rendezvous(store, key):
    """Rank 0's tcp rendezvous (a free port on this host) and a fresh token, put in ``store`` under ``key``."""
    port, token = _collc.tcp_rendezvous()
    at = f"{_address()}:{port}"
    store.set(key, f"{at} {token}")
    return at, token


def _wait_rendezvous(store, key, timeout_s):
    """The rendezvous and token under ``key``, once rank 0 has put them. Polled: a blocking ``get`` holds the store's
    connection, which every other thread of the process then waits for (two pairs' joins deadlocked so)."""
    deadline = time.monotonic() + timeout_s
    pause = 0.0005
    while not store.check([key]):
        if time.monotonic() > deadline:
            raise RuntimeError(f"collc: no tcp rendezvous under `{key}` in the store within {timeout_s:.0f} s")
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    at, token = store.get(key).decode().split(" ", 1)
    return at, token


def _op_name(op, dtype):
    """collc's name for a torch ``ReduceOp`` on ``dtype``: a ``ValueError`` where collc has no such reduction."""
    kind = getattr(op, "op", op)
    if kind == _RED.PREMUL_SUM:
        factor = op.__getstate__()[1]
        if isinstance(factor, torch.Tensor):
            factor = factor.item()
        if dtype.is_floating_point:
            return f"premulsum:{float(factor)!r}"
        if float(factor) != int(factor):
            raise ValueError(f"collc: premul_sum's factor {factor} is not a whole number, and the tensor is {dtype}")
        return f"premulsum:{int(factor)}"
    table = _BOOL_OPS if dtype == torch.bool else _OPS
    if kind not in table:
        raise ValueError(
            f"collc: no reduction {getattr(kind, 'name', kind)} for {dtype}: collc reduces with "
            f"{', '.join(k.name for k in table)}{', premul_sum' if dtype != torch.bool else ''}"
        )
    return table[kind]


def _dtype(t):
    if t.dtype not in _DTYPES:
        raise TypeError(
            f"collc: tensors of {t.dtype} are not supported; collc moves "
            + ", ".join(str(d) for d in _DTYPES)
            + " (complex ones as pairs of reals)"
        )
    return _DTYPES[t.dtype]


def _whole(what, whole, size, block, block_is):
    """A ``ValueError`` unless ``whole`` holds ``size`` blocks of ``block``'s elements (``block_is``: which tensor that
    is)."""
    if whole.numel() != size * block.numel():
        raise ValueError(
            f"collc: {what} has {whole.numel()} elements; it needs {size} x {block.numel()} (the group's size x "
            f"{block_is}'s)"
        )


def _one(tensors, what):
    if len(tensors) != 1:
        raise ValueError(f"collc: {what} takes one tensor per process (one device per rank), got {len(tensors)}")
    return tensors[0]


def _flat(tensors, dtype):
    return torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.empty(0, dtype=dtype)


class _Call:
    """One call's tensors: those it reads and writes (made contiguous where they were not; copied back after), and
    those to copy results out of into a list."""

    def __init__(self):
        self.keep = []
        self.after = []

    def input(self, t):
        self._check(t)
        t = t if t.is_contiguous() else t.contiguous()
        self.keep.append(t)
        return t

    def output(self, t):
        self._check(t)
        if t.is_contiguous():
            self.keep.append(t)
            return t
        tmp = t.contiguous()
        self.keep.append(tmp)
        self.after.append(lambda: t.copy_(tmp))
        return tmp

    def scatter_into(self, flat, outputs):
        """After the call: ``flat``'s blocks into ``outputs``."""
        self.keep.append(flat)

        def copy():
            offset = 0
            for out in outputs:
                n = out.numel()
                out.copy_(flat[offset : offset + n].view_as(out))
                offset += n

        self.after.append(copy)

    def _check(self, t):
        if t.device.type != "cpu":
            raise ValueError(
                f"collc: a tensor on {t.device}: this collc build runs CPU tensors only (its cuda transport is reached "
                "from the collc binary and the Rust API)"
            )
        _dtype(t)


class ProcessGroupCollc(dist.ProcessGroup):
    """One rank's collc communicator for a torch process group."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._store = store
        self._rank = rank
        self._size = size
        self._timeout = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
        self._transport, self._local = _transport(store, rank, size)
        if rank == 0:
            store.set("collc/job", f"torch-{os.getpid()}-{uuid.uuid4().hex[:16]}")
        self._job = store.get("collc/job").decode()
        rendezvous, token = None, None
        if self._transport == "tcp":
            key = "collc/rendezvous"
            rendezvous, token = _rendezvous(store, key) if rank == 0 else _wait_rendezvous(store, key, self._timeout)
        self._comm = _collc.Comm.join(
            self._transport, self._job, rank, size, self._local, self._timeout, rendezvous, token
        )
        self._pairs = {}
        self._pairs_lock = threading.Lock()
        with _LOCK:
            for collective, (name, source) in _ALGORITHMS.items():
                self._comm.set_algorithm(collective, name, source)
            _GROUPS.append(self)

    # -- torch's view of the group ---------------------------------------------------------------------------

    def size(self):
        return self._size

    def getBackendName(self):
        return "collc"

    @property
    def transport(self):
        return self._transport

    def __repr__(self):
        return f"ProcessGroupCollc(rank={self._rank}, size={self._size}, transport={self._transport})"

    # -- calls ---------------------------------------------------------------------------------------------------

    def _submit(self, comm, collective, call, send, recv, count, dtype, op, root, peer, result):
        """Queues one call on ``comm``: a work whose future gets ``result`` (the tensors torch's callers read)."""
        if count == 0:
            return _done(result)
        future = torch.futures.Future()
        after = call.after

        def done(error):
            if error is not None:
                future.set_exception(RuntimeError(f"collc: {collective}: {error}"))
                return
            try:
                for step in after:
                    step()
            except Exception as e:  # noqa: BLE001 - handed to the waiter, as torch's works hand theirs
                future.set_exception(e)
                return
            future.set_result(result)

        def region(t):
            return (t.data_ptr(), t.numel() * t.element_size()) if t is not None else (0, 0)

        comm.submit(collective, region(send), region(recv), count, dtype, op, root, peer, call.keep, done)
        return _Work(future)

    def allreduce(self, tensors, opts=None):
        tensor = _one(tensors, "allreduce")
        opts = _options(opts, c10d.AllreduceOptions)
        call = _Call()
        buf = call.output(tensor)
        op = _op_name(opts.reduceOp, tensor.dtype)
        return self._submit(self._comm, "allreduce", call, buf, buf, buf.numel(), _dtype(buf), op, 0, 0, tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        if not tensors:
            return _done(tensors)
        opts = _options(opts, c10d.AllreduceCoalescedOptions)
        dtype = tensors[0].dtype
        if any(t.dtype != dtype for t in tensors):
            raise ValueError("collc: allreduce_coalesced takes tensors of one dtype")
        call = _Call()
        for t in tensors:
            call._check(t)
        flat = _flat(tensors, dtype)
        call.scatter_into(flat, tensors)
        op = _op_name(opts.reduceOp, dtype)
        return self._submit(self._comm, "allreduce", call, flat, flat, flat.numel(), _dtype(flat), op, 0, 0, tensors)

    def broadcast(self, tensors, opts=None):
        opts = _options(opts, c10d.BroadcastOptions)
        tensor = _one(tensors, "broadcast")
        call = _Call()
        buf = call.output(tensor)
        root = opts.rootRank
        return self._submit(self._comm, "broadcast", call, buf, buf, buf.numel(), _dtype(buf), "sum", root, 0, tensors)

    def reduce(self, tensors, opts=None):
        opts = _options(opts, c10d.ReduceOptions)
        tensor = _one(tensors, "reduce")
        call = _Call()
        buf = call.output(tensor)
        op = _op_name(opts.reduceOp, tensor.dtype)
        return self._submit(
            self._comm, "reduce", call, buf, buf, buf.numel(), _dtype(buf), op, opts.rootRank, 0, tensors
        )

    def allgather(self, output_tensors, input_tensors, opts=None):
        outputs = _one(output_tensors, "allgather")
        tensor = _one(input_tensors, "allgather")
        if len(outputs) != self._size:
            raise ValueError(f"collc: allgather needs {self._size} output tensors, one per rank, got {len(outputs)}")
        if any(o.numel() != tensor.numel() or o.dtype != tensor.dtype for o in outputs):
            raise ValueError(
                "collc: allgather's outputs must each have the input's size and dtype (collc gathers even blocks)"
            )
        call = _Call()
        send = call.input(tensor)
        flat = torch.empty(self._size * send.numel(), dtype=send.dtype)
        call.scatter_into(flat, outputs)
        return self._submit(
            self._comm, "allgather", call, send, flat, send.numel(), _dtype(send), "sum", 0, 0, output_tensors
        )

    def _allgather_base(self, output, input, opts=None):
        _whole("all_gather_into_tensor's output", output, self._size, input, "the input")
        call = _Call()
        recv = call.output(output)
        send = call.input(input)
        return self._submit(
            self._comm, "allgather", call, send, recv, send.numel(), _dtype(send), "sum", 0, 0, [output]
        )

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self._allgather_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return _last(works, outputs)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = _options(opts, c10d.ReduceScatterOptions)
        output = _one(output_tensors, "reduce_scatter")
        inputs = _one(input_tensors, "reduce_scatter")
        if len(inputs) != self._size or any(i.numel() != output.numel() for i in inputs):
            raise ValueError(f"collc: reduce_scatter needs {self._size} inputs, each the output's size")
        call = _Call()
        for i in inputs:
            call._check(i)
        flat = _flat(inputs, output.dtype)
        call.keep.append(flat)
        recv = call.output(output)
        op = _op_name(opts.reduceOp, output.dtype)
        return self._submit(
            self._comm, "reducescatter", call, flat, recv, recv.numel(), _dtype(recv), op, 0, 0, output_tensors
        )

    def _reduce_scatter_base(self, output, input, opts=None):
        opts = _options(opts, c10d.ReduceScatterOptions)
        _whole("reduce_scatter_tensor's input", input, self._size, output, "the output")
        call = _Call()
        send = call.input(input)
        recv = call.output(output)
        op = _op_name(opts.reduceOp, output.dtype)
        return self._submit(
            self._comm, "reducescatter", call, send, recv, recv.numel(), _dtype(recv), op, 0, 0, [output]
        )

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self._reduce_scatter_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return _last(works, outputs)

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = _options(opts, c10d.GatherOptions)
        tensor = _one(input_tensors, "gather")
        root = opts.rootRank
        call = _Call()
        send = call.input(tensor)
        flat = torch.empty(self._size * send.numel(), dtype=send.dtype)
        if self._rank == root:
            outputs = _one(output_tensors, "gather")
            if len(outputs) != self._size or any(o.numel() != send.numel() for o in outputs):
                raise ValueError(f"collc: gather's root needs {self._size} outputs, each the input's size")
            call.scatter_into(flat, outputs)
        else:
            call.keep.append(flat)
        return self._submit(
            self._comm, "gather", call, send, flat, send.numel(), _dtype(send), "sum", root, 0, output_tensors
        )

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = _options(opts, c10d.ScatterOptions)
        output = _one(output_tensors, "scatter")
        root = opts.rootRank
        call = _Call()
        recv = call.output(output)
        if self._rank == root:
            inputs = _one(input_tensors, "scatter")
            if len(inputs) != self._size or any(i.numel() != output.numel() for i in inputs):
                raise ValueError(f"collc: scatter's root needs {self._size} inputs, each the output's size")
            for i in inputs:
                call._check(i)
            flat = _flat(inputs, output.dtype)
        else:
            flat = torch.empty(self._size * recv.numel(), dtype=recv.dtype)
        call.keep.append(flat)
        return self._submit(
            self._comm, "scatter", call, flat, recv, recv.numel(), _dtype(recv), "sum", root, 0, output_tensors
        )

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        for splits, t, what in ((output_split_sizes, output, "output"), (input_split_sizes, input, "input")):
            if splits and any(s != t.shape[0] // self._size for s in splits):
                raise ValueError(
                    f"collc: all_to_all_single with uneven {what} splits {list(splits)}: collc's alltoall moves even "
                    f"blocks (each {t.shape[0] // self._size} rows here); leave the splits out or make them even"
                )
        if input.numel() != output.numel() or input.numel() % self._size:
            raise ValueError(
                f"collc: all_to_all_single needs input and output of one size, a multiple of {self._size} elements "
                f"(got {input.numel()} and {output.numel()})"
            )
        call = _Call()
        send = call.input(input)
        recv = call.output(output)
        count = send.numel() // self._size
        return self._submit(self._comm, "alltoall", call, send, recv, count, _dtype(send), "sum", 0, 0, [output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        if len(output_tensors) != self._size or len(input_tensors) != self._size:
            raise ValueError(f"collc: all_to_all needs {self._size} inputs and outputs, one per rank")
        n = input_tensors[0].numel()
        if any(t.numel() != n for t in list(output_tensors) + list(input_tensors)):
            raise ValueError("collc: all_to_all moves even blocks: every input and output must have one size")
        call = _Call()
        for t in input_tensors:
            call._check(t)
        send = _flat(input_tensors, input_tensors[0].dtype)
        call.keep.append(send)
        recv = torch.empty_like(send)
        call.scatter_into(recv, output_tensors)
        return self._submit(self._comm, "alltoall", call, send, recv, n, _dtype(send), "sum", 0, 0, output_tensors)

    def gather_single(self, output, input, opts=None):
        """torch >= 2.11's ``gather_single``: the root's ``output`` is one flat tensor (others pass an empty one)."""
        opts = _options(opts, c10d.GatherOptions)
        root = opts.rootRank
        call = _Call()
        send = call.input(input)
        if self._rank == root:
            _whole("gather_single's output", output, self._size, send, "the input")
            recv = call.output(output)
        else:
            recv = torch.empty(self._size * send.numel(), dtype=send.dtype)
            call.keep.append(recv)
        return self._submit(
            self._comm, "gather", call, send, recv, send.numel(), _dtype(send), "sum", root, 0, [output]
        )

    # torch >= 2.11 calls the one-tensor forms by these names.
    def all_gather_single(self, output, input, opts=None):
        return self._allgather_base(output, input, opts)

    def reduce_scatter_single(self, output, input, opts=None):
        return self._reduce_scatter_base(output, input, opts)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def barrier(self, opts=None):
        future = torch.futures.Future()

        def done(error):
            if error is None:
                future.set_result([])
            else:
                future.set_exception(RuntimeError(f"collc: barrier: {error}"))

        self._comm.barrier(done)
        return _Work(future)

    # -- point to point ------------------------------------------------------------------------------------------

    def _pair(self, src, dst):
        """The communicator of messages from ``src`` to ``dst`` (this rank is one of them), joined on its worker at
        its first message."""
        if not (0 <= src < self._size and 0 <= dst < self._size) or src == dst:
            raise ValueError(f"collc: a message from rank {src} to rank {dst} in a group of {self._size}")
        with self._pairs_lock:
            comm = self._pairs.get((src, dst))
            if comm is None:
                job = f"{self._job}-p{src}to{dst}"
                me = 0 if self._rank == src else 1
                rendezvous = None
                if self._transport == "tcp":
                    key = f"collc/pair/{src}/{dst}"
                    store, timeout = self._store, self._timeout
                    rendezvous = (
                        (lambda: _rendezvous(store, key))
                        if me == 0
                        else (lambda: _wait_rendezvous(store, key, timeout))
                    )
                local = 2 if self._transport == "shm" else 1
                comm = _collc.Comm.join(self._transport, job, me, 2, local, self._timeout, rendezvous, None, wait=False)
                self._pairs[(src, dst)] = comm
            return comm

    def send(self, tensors, dst, tag=0):
        tensor = _one(tensors, "send")
        call = _Call()
        send = call.input(tensor)
        comm = self._pair(self._rank, dst)
        return self._submit(comm, "sendrecv", call, send, send, send.numel(), _dtype(send), "sum", 0, 1, tensors)

    def recv(self, tensors, src, tag=0):
        tensor = _one(tensors, "recv")
        call = _Call()
        recv = call.output(tensor)
        comm = self._pair(src, self._rank)
        return self._submit(comm, "sendrecv", call, recv, recv, recv.numel(), _dtype(recv), "sum", 0, 1, tensors)

    def recv_anysource(self, tensors, tag=0):
        raise ValueError("collc: recv from any source is not supported (as with NCCL): name the source rank")

    # -- the communicator ----------------------------------------------------------------------------------------

    def _set_algorithm(self, collective, name, source):
        self._comm.set_algorithm(collective, name, source)

    def abort(self):
        self._comm.abort()
        for comm in list(self._pairs.values()):
            comm.abort()

    def shutdown(self):
        for comm in list(self._pairs.values()):
            comm.shutdown()
        self._comm.shutdown()
        with _LOCK:
            if self in _GROUPS:
                _GROUPS.remove(self)


def _options(opts, kind):
    """torch's options object: as given, a default one, or (c10d's ``allreduce(tensors, op)`` overload) one with the
    op given."""
    if opts is None:
        return kind()
    if isinstance(opts, kind):
        return opts
    op, opts = opts, kind()
    opts.reduceOp = op
    return opts


def _last(works, result):
    """One work for several: waits on all but the last before handing back the last (torch's coalesced calls)."""
    if not works:
        return _done(result)
    for work in works[:-1]:
        work.wait()
    return works[-1]


def set_algorithm(collective, path_or_source, group=None):
    """Runs ``collective`` (``"allreduce"``, ``"all_gather"``, ...) with the ``.coll`` algorithm in the file
    ``path_or_source`` (or that text itself) on ``group``'s calls, or every collc group's when ``group`` is None (those
    made later too). Compiled and verified for each group's rank count before it returns: a ``ValueError`` with the
    compiler's diagnostics where it does not verify. Every rank must choose the same algorithm."""
    collective = collective.lower().replace("_", "")
    collective = {
        "allgatherintotensor": "allgather",
        "reducescattertensor": "reducescatter",
        "alltoallsingle": "alltoall",
    }.get(collective, collective)
    if os.path.exists(path_or_source):
        with open(path_or_source, encoding="utf-8") as f:
            name, source = path_or_source, f.read()
    elif "\n" in path_or_source or "{" in path_or_source:
        name, source = "<set_algorithm>", path_or_source
    else:
        raise FileNotFoundError(f"collc.set_algorithm: no file `{path_or_source}`")
    if group is None:
        with _LOCK:
            groups = list(_GROUPS)
        for g in groups:
            g._set_algorithm(collective, name, source)
        with _LOCK:
            _ALGORITHMS[collective] = (name, source)
    else:
        _backend_of(group)._set_algorithm(collective, name, source)


def algorithm_of(collective, group=None):
    """The ``.coll`` file or library algorithm ``set_algorithm`` chose for ``collective``, else None (chosen per call
    size)."""
    collective = collective.lower().replace("_", "")
    chosen = _ALGORITHMS.get(collective)
    return chosen[0] if chosen else None


def _backend_of(group):
    if isinstance(group, ProcessGroupCollc):
        return group
    raise ValueError(f"collc: {group!r} is not a collc process group")


def _create(store, rank, size, timeout):
    return ProcessGroupCollc(store, rank, size, timeout)


def _at_exit():
    """Leaves collc's groups before the interpreter finalizes, as ``destroy_process_group`` would: a group torch still
    holds then is destroyed by C++ after Python is gone, and its Python half can no longer be let go (the process
    aborted with "terminate called without an active exception" after a failed call)."""
    with _LOCK:
        live = list(_GROUPS)
    if not live:
        return
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - leaving at exit is best effort; the groups below are shut down regardless
        warnings.warn(f"collc: destroy_process_group at exit: {e}", stacklevel=1)
    for group in live:
        group.shutdown()


def register():
    """Registers the backend ``collc`` for CPU tensors (once per process; ``import collc`` does it)."""
    if "collc" in dist.Backend.backend_list:
        return
    dist.Backend.register_backend("collc", _create, devices=["cpu"])
    atexit.register(_at_exit)
