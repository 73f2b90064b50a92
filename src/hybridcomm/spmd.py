"""Run one function on N ranks: spawned worker processes with torch.distributed set up.

Used by the tests, `hybridcomm check` and the benchmarks. Workers stay alive between
calls (starting torch in N processes costs seconds), and every call has a deadline:
a call that does not finish in time kills the workers and raises TimeoutError, so a
hang never outlives its timeout.

`fn` must be importable (a module-level function); it is called as fn(*args) on every
rank, with torch.distributed initialised (gloo on CPU, NCCL on CUDA, one GPU per rank).
With share_gpus, more CUDA ranks than GPUs take turns on them (rank r on GPU r % count) and
torch.distributed runs gloo, since NCCL refuses two ranks on one GPU: for correctness tests on
a machine with fewer GPUs than ranks (shared_gpu.py says what that can and cannot show).
A CPU pool's workers see no GPU, so what runs there on a GPU machine runs as on one without.
"""

from __future__ import annotations

import os
import pickle
import queue
import socket
import time
import traceback
from datetime import timedelta

import torch.multiprocessing as mp


class RemoteError(RuntimeError):
    """A rank raised; the message holds every failing rank's traceback."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


worker_device: str | None = None  # in a worker process: "cpu" or "cuda", the pool's device


def _worker(rank: int, world_size: int, device: str, share_gpus: bool, port: int, tasks, results) -> None:
    global worker_device
    worker_device = device
    if device == "cpu":  # a CPU pool on a GPU machine stays on the CPU: a default device is the CPU
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # (read when CUDA starts, which nothing here did yet)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    if device == "cuda" and not share_gpus:
        dist.init_process_group("nccl", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=120),
                                device_id=torch.device("cuda", torch.cuda.current_device()))
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=60))
    while True:
        task = tasks.get()
        if task is None:
            break
        call, fn, args = task
        try:
            results.put((call, rank, True, fn(*args)))
        except BaseException as e:  # report everything, keep serving
            tb = traceback.format_exc()
            try:  # the parent must be able to load it, not only this process to dump it
                pickle.loads(pickle.dumps(e))
                payload = (e, tb)
            except Exception:
                payload = (RuntimeError(f"{type(e).__name__}: {e}"), tb)
            results.put((call, rank, False, payload))
    dist.destroy_process_group()


class SpmdPool:
    def __init__(self, world_size: int, device: str = "cpu", start_timeout: float = 120.0,
                 share_gpus: bool = False):
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device: expected 'cpu' or 'cuda', got {device!r}")
        self.world_size, self.device = world_size, device
        ctx = mp.get_context("spawn")
        self._tasks = [ctx.Queue() for _ in range(world_size)]
        self._results = ctx.Queue()
        self._calls = 0  # numbers each run()
        port = free_port()
        self._procs = [ctx.Process(target=_worker, daemon=True,
                                   args=(r, world_size, device, share_gpus, port, self._tasks[r], self._results))
                       for r in range(world_size)]
        for p in self._procs:
            p.start()
        self.run(_ready, timeout=start_timeout)

    def run(self, fn, *args, timeout: float = 300.0) -> list:
        """fn(*args) on every rank; returns the per-rank results in rank order.

        If any rank raised, re-raises that exception (the lowest failing rank's), chained
        to a RemoteError that holds every failing rank's traceback."""
        if self._procs is None:
            raise RuntimeError("SpmdPool is closed")
        self._calls += 1
        for q in self._tasks:
            q.put((self._calls, fn, args))
        got = self._collect(getattr(fn, "__name__", fn), timeout)
        failed = {r: v for r, (ok, v) in got.items() if not ok}
        if failed:
            details = "\n".join(f"--- rank {r} ---\n{tb}" for r, (_, tb) in sorted(failed.items()))
            first = failed[min(failed)][0]
            raise first from RemoteError(details)
        return [got[r][1] for r in range(self.world_size)]

    def _collect(self, name, timeout: float) -> dict[int, tuple[bool, object]]:
        """rank -> (ok, value) of the current call; kills the workers on a timeout, a dead worker or a
        result that cannot be loaded (then their state is unknown)."""
        got: dict[int, tuple[bool, object]] = {}
        deadline = time.monotonic() + timeout
        while len(got) < self.world_size:
            try:
                call, rank, ok, value = self._results.get(timeout=0.5)
                if call == self._calls:  # (a late result of an earlier call, e.g. one a test's timeout interrupted)
                    got[rank] = (ok, value)
                continue
            except queue.Empty:
                pass
            except Exception as e:
                self.close(kill=True)
                raise RuntimeError(f"{name}: a worker's result could not be loaded "
                                   f"({type(e).__name__}: {e}); the worker processes were killed") from e
            dead = [(r, p.exitcode) for r, p in enumerate(self._procs) if not p.is_alive()]
            if dead or time.monotonic() > deadline:
                missing = sorted(set(range(self.world_size)) - set(got))
                self.close(kill=True)
                if dead:
                    raise RuntimeError(f"{name}: worker processes exited (rank, exit code): {dead}")
                raise TimeoutError(f"{name} did not finish within {timeout:g} s on ranks {missing}; "
                                   f"the worker processes were killed")
        return got

    def close(self, kill: bool = False) -> None:
        if self._procs is None:
            return
        if not kill:
            for q in self._tasks:
                q.put(None)
            for p in self._procs:
                p.join(timeout=30)
        for p in self._procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
        self._procs = None

    @property
    def alive(self) -> bool:
        return self._procs is not None and all(p.is_alive() for p in self._procs)

    def __enter__(self) -> "SpmdPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close(kill=exc[0] is not None)


def _ready() -> int:
    import torch.distributed as dist
    return dist.get_rank()
