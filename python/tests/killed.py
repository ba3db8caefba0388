"""A worker killed (or stopped) mid-step: the others raise a RuntimeError naming it, within the timeout.

``killed.py kill|stop DUMP_DIR`` starts 4 workers as torchrun does (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT; not under torchrun itself, whose agent would stop the others the moment one dies), waits until they are
all in a loop of all-reduces, then SIGKILLs rank 2 (the others must raise at once, as gloo's do when a socket closes)
or SIGSTOPs it (a hung rank: they raise at the group's timeout, leaving the flight recorder's dumps in DUMP_DIR for
``collc fr analyze``), and checks that each other worker raised in time, naming rank 2. ``killed.py --worker`` is one
worker.
"""

import datetime
import os
import signal
import socket
import subprocess
import sys
import threading
import time

TIMEOUT_S = 10
VICTIM = 2
SIZE = 4


def worker():
    import collc  # noqa: F401 - registers the backend
    import torch
    import torch.distributed as dist

    dist.init_process_group("collc", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    rank = dist.get_rank()
    t = torch.ones(1 << 16)
    step = 0
    try:
        while True:
            dist.all_reduce(t)
            t.fill_(1.0)
            step += 1
            if step == 50:
                print(f"looping {rank}", flush=True)
    except RuntimeError as e:
        print(f"raised {rank} after step {step} at {time.time():.3f}: {e}", flush=True)
        # Exits when the driver says: after the victim is gone, so the last rank out removes the job's files.
        sys.stdin.readline()
        sys.exit(0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def driver(how, dump_dir):
    env = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        WORLD_SIZE=str(SIZE),
        LOCAL_WORLD_SIZE=str(SIZE),
        COLLC_DUMP_DIR=dump_dir,
    )
    workers = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker"],
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(SIZE)
    ]
    lines = [[] for _ in range(SIZE)]
    raised = [threading.Event() for _ in range(SIZE)]

    def read(r):
        for line in workers[r].stdout:
            lines[r].append(line)
            if line.startswith(f"raised {r} "):
                raised[r].set()

    readers = [threading.Thread(target=read, args=(r,), daemon=True) for r in range(SIZE)]
    for reader in readers:
        reader.start()
    # Every worker in its loop of all-reduces, then rank 2 killed or stopped.
    deadline = time.time() + 120
    while not all(any(l.startswith("looping") for l in lines[r]) for r in range(SIZE)):
        if time.time() > deadline or any(w.poll() is not None for w in workers):
            raise AssertionError(f"not every worker reached its loop: {[''.join(l)[-2000:] for l in lines]}")
        time.sleep(0.05)
    killed_at = time.time()
    if how == "kill":
        workers[VICTIM].send_signal(signal.SIGKILL)
        workers[VICTIM].wait()  # reaped at once, as torchrun's agent does
        within = 2.0
    else:
        workers[VICTIM].send_signal(signal.SIGSTOP)
        within = TIMEOUT_S + 2.0
    failures = []
    survivors = [r for r in range(SIZE) if r != VICTIM]
    for r in survivors:
        if not raised[r].wait(timeout=TIMEOUT_S + 30):
            failures.append(
                f"rank {r} did not raise within {TIMEOUT_S + 30} s of rank {VICTIM}'s {how}:\n"
                + "".join(lines[r])[-3000:]
            )
            continue
        line = next(l for l in lines[r] if l.startswith(f"raised {r} "))
        at = float(line.split(" at ")[1].split(":")[0])
        if f"rank {VICTIM}" not in line:
            failures.append(f"rank {r}'s error does not name rank {VICTIM}: {line}")
        if at - killed_at > within:
            failures.append(f"rank {r} raised {at - killed_at:.1f} s after the {how}, past {within} s")
        print(f"rank {r}: {at - killed_at:.2f} s after the {how}: {line.split(': ', 1)[1].strip()}", flush=True)
    if how == "stop":
        workers[VICTIM].kill()
        workers[VICTIM].wait()
    for r in survivors:
        try:
            workers[r].communicate("exit\n", timeout=60)
        except subprocess.TimeoutExpired:
            workers[r].kill()
            failures.append(f"rank {r} did not exit after raising")
        if workers[r].returncode != 0:
            failures.append(f"rank {r} exited {workers[r].returncode}:\n" + "".join(lines[r])[-3000:])
    if failures:
        raise AssertionError("\n".join(failures))
    print(f"{how}: ranks {survivors} raised within {within} s, naming rank {VICTIM}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker()
    else:
        driver(sys.argv[1], sys.argv[2])
