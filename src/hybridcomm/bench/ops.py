"""`hybridcomm bench ops`: the group collectives of the op registry over the world,
message sizes 2 KB - 64 MB, bf16, our kernels and the baselines in the same run.

Columns (µs per call, graph replay, median, max over ranks):
  hybridcomm     the Communicator's choice (selection table)
  hc_one_shot /  each of our algorithms forced, which is how the table is filled
  hc_two_shot /  (hc_one_shot_lamport: the one-shot on the Lamport protocol, docs/lamport.md)
  hc_two_shot_bulk / hc_one_shot_lamport
  hc_sms<N>      with --max-sms: the Communicator made with max_sms=N (its table's choice, at most N blocks)
  nccl, nccl_symm, symm_one_shot, symm_two_shot: baselines (bench/baselines.py)
Message size: the tensor ops.OPS names as the op's message. Forced algorithms run through
Communicators built with `table=algorithms.forced(...)`; a column is left out where that
kernel cannot run the size.
The row collectives move one row of size/world bytes per rank.
On CPU only the reference backend runs (eager wall clock; for development, not speed).
With --share-gpus (ranks sharing a GPU, under MPS) only the hc_<algorithm> columns run: a way to
compare two builds of our kernels on one GPU, not a speed claim (bench/shared.py).
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import collectives
from ..algorithms import forced
from ..communicator import Communicator
from ..layout import Layout
from ..ops import OPS as REGISTRY
from ..workspace import DEFAULT_AREA_BYTES, describe_plan
from . import shared, timing
from .baselines import NcclSymmetricBuffers, SymmMemBuffer, baseline_buffers
from .eager import eager_costs

KiB, MiB = 1 << 10, 1 << 20
DEFAULT_SIZES = [2 * KiB, 8 * KiB, 32 * KiB, 128 * KiB, 256 * KiB, 512 * KiB, 1 * MiB, 2 * MiB, 4 * MiB,
                 8 * MiB, 16 * MiB, 64 * MiB]
OPS = tuple(name for name, spec in REGISTRY.items() if not spec.on_world and not spec.quantized)  # group collectives
BASELINES = ("nccl", "nccl_symm", "symm_one_shot", "symm_two_shot")
DTYPE = torch.bfloat16


def busbw_gbps(op: str, nbytes: int, us: float, n: int) -> float:
    """nccl-tests bus bandwidth: all-reduce algbw * 2(n-1)/n, gathers/scatters algbw * (n-1)/n."""
    factor = 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n
    return nbytes / (us * 1e-6) * factor / 1e9


@dataclass
class Forced:
    """A Communicator that runs one algorithm of `ops` at every size."""

    comm: Communicator
    ops: set[str]


def forced_communicators(layout: Layout, ops: list[str], **kwargs) -> dict[str, Forced]:
    """"hc_<algorithm>" -> Forced, one per algorithm name the registry lists for `ops`
    (creating each Communicator is collective)."""
    by_name: dict[str, set[str]] = {}
    for op in ops:
        for a in REGISTRY[op].algorithms:
            by_name.setdefault(a.name, set()).add(op)
    return {f"hc_{name}": Forced(Communicator(layout, table=forced(dict.fromkeys(with_it, name)), **kwargs), with_it)
            for name, with_it in by_name.items()}


def budget_communicators(layout: Layout, ops: list[str], max_sms: tuple[int, ...], **kwargs) -> dict[str, Forced]:
    """"hc_sms<N>" -> Forced, for each N: the Communicator made with max_sms=N, running its table's
    choice (add_forced_calls leaves the column out where that is NCCL)."""
    return {f"hc_sms{k}": Forced(Communicator(layout, max_sms=k, **kwargs), set(ops)) for k in max_sms}


def add_forced_calls(calls: dict, op: str, forced_comms: dict[str, Forced], call_with) -> None:
    """calls[label] = call_with(comm) for every forced Communicator of `op` whose kernel can
    run it (run once to find out: `last_choice` says which backend ran)."""
    for label, f in forced_comms.items():
        if op not in f.ops:
            continue
        call = lambda comm=f.comm: call_with(comm)  # noqa: E731
        call()
        if f.comm.last_choice.backend == "nvlink":
            calls[label] = call


def _calls(op: str, nbytes: int, comm: Communicator, forced_comms: dict[str, Forced], symm: NcclSymmetricBuffers,
           sm: SymmMemBuffer):
    """name -> zero-argument call, for every implementation that can run this op and size."""
    n, elem = dist.get_world_size(), torch.finfo(DTYPE).bits // 8
    device = comm.device
    numel = nbytes // elem
    calls = {}
    if op == "all_reduce":
        x = torch.randn(numel, dtype=DTYPE, device=device)
        calls["hybridcomm"] = lambda: comm.all_reduce(x)
        add_forced_calls(calls, op, forced_comms, lambda c: c.all_reduce(x))
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
        add_forced_calls(calls, op, forced_comms, lambda c: c.all_gather_v(x, sizes))
        calls["nccl"] = lambda: collectives.all_gather_single(out, x)
        if symm.buffers is not None:
            xs, outs = symm.view(0, (1, row), DTYPE), symm.view(1, (n, row), DTYPE)
            calls["nccl_symm"] = lambda: collectives.all_gather_single(outs, xs)
    else:
        x, out = torch.randn(n, row, dtype=DTYPE, device=device), torch.empty(1, row, dtype=DTYPE, device=device)
        calls["hybridcomm"] = lambda: comm.reduce_scatter_v(x, sizes)
        add_forced_calls(calls, op, forced_comms, lambda c: c.reduce_scatter_v(x, sizes))
        calls["nccl"] = lambda: collectives.reduce_scatter_single(out, x)
        if symm.buffers is not None:
            xs, outs = symm.view(0, (n, row), DTYPE), symm.view(1, (1, row), DTYPE)
            calls["nccl_symm"] = lambda: collectives.reduce_scatter_single(outs, xs)
    return calls


def sweep_ops(sizes: list[int], ops: list[str], max_sms: tuple[int, ...] = (), share_gpus: bool = False) -> dict:
    """Worker entry (every rank): one record per (op, size, implementation).
    share_gpus: ranks share a GPU (bench/shared.py): our forced algorithms only, no eager costs."""
    n = dist.get_world_size()
    own = {"max_sms": shared.sm_share(n)} if share_gpus else {}
    comm = Communicator(Layout(n), **own)
    forced_comms = {**forced_communicators(Layout(n), ops, **own), **budget_communicators(Layout(n), ops, max_sms)}
    device = comm.device
    biggest = max(sizes)
    symm, sm = baseline_buffers([biggest, biggest], biggest, device, share_gpus)
    records, overhead = [], {}
    for op in ops:
        for nbytes in sizes:
            calls = _calls(op, nbytes, comm, forced_comms, symm, sm)
            calls = shared.ours_only(calls, forced_comms) if share_gpus else calls
            names = sorted(calls)
            us = [timing.graph_us(calls[name], timing.calls_per_graph(nbytes)) for name in names]
            us = timing.max_over_ranks(us)
            for name, t in zip(names, us):
                records.append({"op": op, "bytes": nbytes, "impl": name, "us": t,
                                "busbw_GBps": busbw_gbps(op, nbytes, t, n)})
            if dist.get_rank() == 0:
                row = "  ".join(f"{name} {t:.2f}" for name, t in zip(names, us))
                print(f"[ops] {op:<16} {nbytes:>10} B  {row}", file=sys.stderr, flush=True)
    if not share_gpus:
        # Eager cost of one small call through the Communicator (Python + checks + launch).
        x = torch.randn(1024, dtype=DTYPE, device=device)
        overhead["graph_hybridcomm_all_reduce_2KB"] = timing.graph_us(lambda: comm.all_reduce(x), 100)
        overhead.update(eager_costs(comm))  # every op, eager, against its torch.distributed call (2 KB rows)
        overhead = dict(zip(overhead, timing.max_over_ranks(list(overhead.values()))))
    results = {"environment": timing.environment(), "world_size": n, "dtype": str(DTYPE),
               "workspace": describe_plan(comm.layout, DEFAULT_AREA_BYTES),  # what `hybridcomm info` prints
               "nccl_symm_note": symm.error, "symm_mem_note": sm.error, "records": records}
    if overhead:
        results["eager_overhead_us"] = overhead
    if share_gpus:
        results["shared_gpu"] = shared.description(n)
    return results


def sweep_ops_cpu(sizes: list[int], ops: list[str]) -> dict:
    """CPU development path: the reference backend's eager wall clock (not a speed claim)."""
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
            us = timing.max_over_ranks([statistics.median(timing.eager_times(call, 5)[0])])[0]
            records.append({"op": op, "bytes": nbytes, "impl": "reference", "us": us,
                            "busbw_GBps": busbw_gbps(op, nbytes, us, n)})
            if dist.get_rank() == 0:
                print(f"[ops] {op:<16} {nbytes:>10} B  reference {us:10.1f} us", file=sys.stderr, flush=True)
    return {"environment": timing.environment(), "world_size": n, "dtype": "float32", "records": records,
            "timing": f"eager wall clock on CPU, {n} gloo processes, reference backend, mean of 5 calls, max over "
                      f"ranks: a development path, not a speed claim"}


def bench_ops(world_size: int, device: str, sizes: list[int] | None = None, ops: list[str] | None = None,
              timeout_s: float = 900.0, max_sms: tuple[int, ...] = (), share_gpus: bool = False) -> dict:
    """Run the sweep on `world_size` spawned ranks; returns the JSON-serialisable results.
    max_sms (GPUs): also the Communicator made with each of these max_sms (columns hc_sms<N>).
    share_gpus (GPUs): ranks share GPUs, our kernels only (bench/shared.py)."""
    from ..spmd import SpmdPool

    sizes, ops = sizes or DEFAULT_SIZES, ops or list(OPS)
    with SpmdPool(world_size, device, share_gpus=share_gpus) as pool:
        if device == "cpu":
            return pool.run(sweep_ops_cpu, [s for s in sizes if s <= 1 * MiB], ops, timeout=timeout_s)[0]
        return pool.run(sweep_ops, sizes, ops, tuple(max_sms), share_gpus, timeout=timeout_s)[0]
