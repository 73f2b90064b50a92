"""`hybridcomm bench ops`: all_reduce / all_gather_v / reduce_scatter_v over the world,
message sizes 2 KB - 64 MB, bf16, our kernels and the baselines in the same run.

Columns (µs per call, graph replay, median, max over ranks):
  hybridcomm     the Communicator's choice (selection table)
  hc_one_shot /  each of our algorithms forced, which is how the table is filled
  hc_two_shot /
  hc_two_shot_bulk
  nccl, nccl_symm, symm_one_shot, symm_two_shot: baselines (bench/baselines.py)
Message size: all_reduce input, all_gather_v output, reduce_scatter_v input (as DEVICE.md).
all_gather_v / reduce_scatter_v move one row of size/world bytes per rank.
On CPU only the reference backend runs (eager wall clock; for development, not speed).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from ..communicator import Communicator
from ..layout import Layout
from . import timing
from .baselines import NcclSymmetricBuffers, SymmMemBuffer

KiB, MiB = 1 << 10, 1 << 20
DEFAULT_SIZES = [2 * KiB, 8 * KiB, 32 * KiB, 128 * KiB, 256 * KiB, 512 * KiB, 1 * MiB, 2 * MiB, 4 * MiB,
                 8 * MiB, 16 * MiB, 64 * MiB]
OPS = ("all_reduce", "all_gather_v", "reduce_scatter_v")
BASELINES = ("nccl", "nccl_symm", "symm_one_shot", "symm_two_shot")
DTYPE = torch.bfloat16


def busbw_gbps(op: str, nbytes: int, us: float, n: int) -> float:
    """nccl-tests bus bandwidth: all-reduce algbw * 2(n-1)/n, gathers/scatters algbw * (n-1)/n."""
    factor = 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n
    return nbytes / (us * 1e-6) * factor / 1e9


def _calls(op: str, nbytes: int, comm: Communicator, symm: NcclSymmetricBuffers, sm: SymmMemBuffer):
    """name -> zero-argument call, for every implementation that can run this op and size."""
    n, elem = dist.get_world_size(), torch.finfo(DTYPE).bits // 8
    device, world = comm.device, comm.groups["world"]
    nvlink = comm.backends["nvlink"]
    numel = nbytes // elem
    calls = {}
    if op == "all_reduce":
        x = torch.randn(numel, dtype=DTYPE, device=device)
        calls["hybridcomm"] = lambda: comm.all_reduce(x)
        for alg in ("one_shot", "two_shot", "two_shot_bulk"):
            if nvlink.blocker(op, alg, world, x, None) is None:
                calls[f"hc_{alg}"] = lambda alg=alg: nvlink.all_reduce(x, world, alg)
        calls["nccl"] = lambda: dist.all_reduce(x)
        if symm.buffers is not None:
            xs = symm.view(0, (numel,), DTYPE)
            calls["nccl_symm"] = lambda: dist.all_reduce(xs)
        if sm.buffer is not None:
            xm = sm.view(numel, DTYPE)
            calls["symm_one_shot"] = lambda: sm.one_shot(xm)
            calls["symm_two_shot"] = lambda: sm.two_shot(xm)
        return calls
    row = numel // n  # one row of size/n per rank
    sizes = [1] * n
    if op == "all_gather_v":
        x, out = torch.randn(1, row, dtype=DTYPE, device=device), torch.empty(n, row, dtype=DTYPE, device=device)
        calls["hybridcomm"] = lambda: comm.all_gather_v(x, sizes)
        calls["nccl"] = lambda: dist.all_gather_into_tensor(out, x)
        if symm.buffers is not None:
            xs, outs = symm.view(0, (1, row), DTYPE), symm.view(1, (n, row), DTYPE)
            calls["nccl_symm"] = lambda: dist.all_gather_into_tensor(outs, xs)
    else:
        x, out = torch.randn(n, row, dtype=DTYPE, device=device), torch.empty(1, row, dtype=DTYPE, device=device)
        calls["hybridcomm"] = lambda: comm.reduce_scatter_v(x, sizes)
        calls["nccl"] = lambda: dist.reduce_scatter_tensor(out, x)
        if symm.buffers is not None:
            xs, outs = symm.view(0, (n, row), DTYPE), symm.view(1, (1, row), DTYPE)
            calls["nccl_symm"] = lambda: dist.reduce_scatter_tensor(outs, xs)
    return calls


def sweep_ops(sizes: list[int], ops: list[str]) -> dict:
    """Worker entry (every rank): one record per (op, size, implementation)."""
    n = dist.get_world_size()
    comm = Communicator(Layout(n))
    device = comm.device
    biggest = max(sizes)
    symm = NcclSymmetricBuffers([biggest, biggest], device)
    sm = SymmMemBuffer(biggest, device)
    records, overhead = [], {}
    for op in ops:
        for nbytes in sizes:
            calls = _calls(op, nbytes, comm, symm, sm)
            names = sorted(calls)
            us = [timing.graph_us(calls[name], timing.calls_per_graph(nbytes)) for name in names]
            us = timing.max_over_ranks(us)
            for name, t in zip(names, us):
                records.append({"op": op, "bytes": nbytes, "impl": name, "us": t,
                                "busbw_GBps": busbw_gbps(op, nbytes, t, n)})
            if dist.get_rank() == 0:
                best = min(t for name, t in zip(names, us) if name in BASELINES)
                ours = us[names.index("hybridcomm")]
                print(f"[ops] {op:<16} {nbytes:>10} B  hybridcomm {ours:8.2f} us  best baseline {best:8.2f} us",
                      file=sys.stderr, flush=True)
    # Eager cost of one small call through the Communicator (Python + checks + launch).
    x = torch.randn(1024, dtype=DTYPE, device=device)
    overhead["hybridcomm_all_reduce_2KB"] = timing.eager_us(lambda: comm.all_reduce(x))
    overhead["nccl_all_reduce_2KB"] = timing.eager_us(lambda: dist.all_reduce(x))
    overhead["graph_hybridcomm_all_reduce_2KB"] = timing.graph_us(lambda: comm.all_reduce(x), 100)
    overhead = dict(zip(overhead, timing.max_over_ranks(list(overhead.values()))))
    return {"environment": timing.environment(), "world_size": n, "dtype": str(DTYPE),
            "workspace": comm.backends["nvlink"].workspace.describe(),
            "nccl_symm_note": symm.error, "symm_mem_note": sm.error,
            "records": records, "eager_overhead_us": overhead}


def sweep_ops_cpu(sizes: list[int], ops: list[str]) -> dict:
    """CPU development path: the reference backend's eager wall clock (not a speed claim)."""
    import time

    n = dist.get_world_size()
    comm = Communicator(Layout(n))
    records = []
    for op in ops:
        for nbytes in sizes:
            numel = max(nbytes // 4 // n, 4) * n
            x = torch.randn(numel, dtype=torch.float32) if op == "all_reduce" else None
            call = {"all_reduce": lambda: comm.all_reduce(x),
                    "all_gather_v": lambda: comm.all_gather_v(torch.randn(1, numel // n), [1] * n),
                    "reduce_scatter_v": lambda: comm.reduce_scatter_v(torch.randn(n, numel // n), [1] * n)}[op]
            call()
            dist.barrier()
            start = time.perf_counter()
            for _ in range(5):
                call()
            us = timing.max_over_ranks([(time.perf_counter() - start) * 1e6 / 5])[0]
            records.append({"op": op, "bytes": nbytes, "impl": "reference", "us": us,
                            "busbw_GBps": busbw_gbps(op, nbytes, us, n)})
            if dist.get_rank() == 0:
                print(f"[ops] {op:<16} {nbytes:>10} B  reference {us:10.1f} us", file=sys.stderr, flush=True)
    return {"environment": timing.environment(), "world_size": n, "dtype": "float32", "records": records,
            "timing": f"eager wall clock on CPU, {n} gloo processes, reference backend, mean of 5 calls, max over "
                      f"ranks: a development path, not a speed claim"}


def bench_ops(world_size: int, device: str, sizes: list[int] | None = None, ops: list[str] | None = None,
              timeout_s: float = 900.0) -> dict:
    """Run the sweep on `world_size` spawned ranks; returns the JSON-serialisable results."""
    from ..spmd import SpmdPool

    sizes, ops = sizes or DEFAULT_SIZES, ops or list(OPS)
    if device == "cpu":
        sizes = [s for s in sizes if s <= 1 * MiB]
    with SpmdPool(world_size, device) as pool:
        fn = sweep_ops if device == "cuda" else sweep_ops_cpu
        return pool.run(fn, sizes, ops, timeout=timeout_s)[0]
