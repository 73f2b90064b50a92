"""How every benchmark number is taken (docs/architecture.md, "Benchmarks").

A call is captured `calls` times back to back in one CUDA graph; the graph is replayed
`repeats` times between events; the median µs per call is taken on each rank and the
max over ranks is reported (the slowest rank sets a collective's time). Eager launch
overhead stays out of the number; `eager_us` (wall clock) and `issue_us` (host) measure it.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
import torch.distributed as dist

REPEATS = 7


def calls_per_graph(nbytes: int) -> int:
    """Many calls for small messages (so one replay is long enough to time), few for big ones."""
    return max(5, min(100, int(256e6 // max(nbytes, 1))))


def graph_times(call: Callable[[], object], calls: int = 1, replays: int = 1, repeats: int = REPEATS,
                warmup: int = 3) -> tuple[list[float], object]:
    """µs per call on this rank, one value per repeat, and the captured graph's output.

    `call` runs `warmup` times eagerly on a side stream (lazy NCCL setup and allocations
    happen there, not in capture), then `calls` times back to back in one CUDA graph; each
    repeat replays the graph `replays` times between two events.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(warmup, 1)):
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            out = call()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        dist.barrier()
        torch.cuda.synchronize()
        times.append(replay_us(graph, replays) / calls)
    del graph
    torch.cuda.synchronize()
    return times, out


def replay_us(graph: torch.cuda.CUDAGraph, replays: int) -> float:
    """µs per replay of `graph`, timed with CUDA events around `replays` back-to-back replays."""
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) * 1e3 / replays


def graph_us(call: Callable[[], object], calls: int, repeats: int = REPEATS) -> float:
    """Median µs per call on this rank, timed as CUDA graph replays."""
    return statistics.median(graph_times(call, calls, repeats=repeats)[0])


def eager_times(call: Callable[[], object], steps: int, warmup: int = 1) -> tuple[list[float], object]:
    """Wall-clock µs of each of `steps` eager calls, the ranks starting each together, and the
    last output (CPU runs: no graphs there)."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(steps):
        dist.barrier()  # start together, so a call is not timed waiting for a late peer
        start = time.perf_counter()
        out = call()
        times.append((time.perf_counter() - start) * 1e6)
    return times, out


def eager_us(call: Callable[[], object], calls: int = 200) -> float:
    """Wall-clock µs per call of `calls` back-to-back eager calls, to the end of the last on the
    device: the host cost when the host is the bottleneck, plus whatever the device and the
    peers (a collective waits for all) add. Noisy: take the median of several (bench/eager.py)."""
    for _ in range(10):
        call()
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e6 / calls


ISSUE_CALLS = 20  # far below the launch queue's depth (~1000 launches), so no call waits for room


def issue_us(call: Callable[[], object], calls: int = ISSUE_CALLS) -> float:
    """Host µs per eager call to return (Python, checks, allocation, launch), the device idle at
    the start and nothing synchronised while timing: independent of the peers' jitter."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    dist.barrier()  # every rank's calls finished before the next measurement starts
    return elapsed * 1e6 / calls


def max_over_ranks(values: list[float]) -> list[float]:
    """Element-wise max over ranks (NaN counts as +inf, so a failure is not hidden)."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    t = torch.nan_to_num(torch.tensor(values, dtype=torch.float64, device=device), nan=float("inf"))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def environment() -> dict:
    """Date, GPU, driver, torch, CUDA and NCCL versions: every results file carries them."""
    import datetime
    import subprocess

    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "torch": torch.__version__}
    if torch.cuda.is_available():
        env.update(gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda,
                   gpus=torch.cuda.device_count(),
                   nccl=".".join(map(str, torch.cuda.nccl.version())))
        try:
            env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=20).stdout.split()[0]
        except Exception as e:  # report what failed rather than a made-up value
            env["driver"] = f"unknown ({type(e).__name__})"
    return env
