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
import time

TIMEOUT_S = 10
VICTIM = 2
SIZE = 4


def worker():
    import torch
    import torch.distributed as dist

    import collc  # noqa: F401 - registers the backend

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
        sys.exit(0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def driver(how, dump_dir):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(SIZE),
               LOCAL_WORLD_SIZE=str(SIZE), COLLC_DUMP_DIR=dump_dir)
    workers = [
        subprocess.Popen([sys.executable, __file__, "--worker"], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(SIZE)
    ]
    # Every worker in its loop of all-reduces, then rank 2 killed.
    for r, w in enumerate(workers):
        for line in w.stdout:
            if line.startswith("looping"):
                break
        else:
            raise AssertionError(f"worker {r} ended before its loop (exit {w.wait()})")
    killed_at = time.time()
    if how == "kill":
        workers[VICTIM].send_signal(signal.SIGKILL)
        workers[VICTIM].wait()  # reaped at once, as torchrun's agent does
        within = 2.0
    else:
        workers[VICTIM].send_signal(signal.SIGSTOP)
        within = TIMEOUT_S + 2.0
    failures = []
    for r, w in enumerate(workers):
        if r == VICTIM:
            continue
        try:
            out, _ = w.communicate(timeout=TIMEOUT_S + 30)
        except subprocess.TimeoutExpired:
            w.kill()
            failures.append(f"rank {r} did not raise within {TIMEOUT_S + 30} s of rank {VICTIM}'s death")
            continue
        raised = [line for line in out.splitlines() if line.startswith(f"raised {r} ")]
        if w.returncode != 0 or not raised:
            failures.append(f"rank {r} exited {w.returncode} without raising:\n{out[-3000:]}")
            continue
        at = float(raised[0].split(" at ")[1].split(":")[0])
        if f"rank {VICTIM}" not in raised[0]:
            failures.append(f"rank {r}'s error does not name rank {VICTIM}: {raised[0]}")
        if at - killed_at > within:
            failures.append(f"rank {r} raised {at - killed_at:.1f} s after the {how}, past {within} s")
        print(f"rank {r}: {at - killed_at:.2f} s after the {how}: {raised[0].split(': ', 1)[1]}", flush=True)
    if how == "stop":
        workers[VICTIM].kill()
        workers[VICTIM].wait()
    if failures:
        raise AssertionError("\n".join(failures))
    print(f"{how}: ranks {[r for r in range(SIZE) if r != VICTIM]} raised within {within} s, naming rank {VICTIM}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker()
    else:
        driver(sys.argv[1], sys.argv[2])
