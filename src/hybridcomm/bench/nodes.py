"""`hybridcomm bench nodes`: ops across simulated nodes, ours against flat NCCL in the same run.

The world is cut into nodes of `ranks_per_node` ranks (default world / 2: two nodes). On one
host the legs "across nodes" still run over NVLink (NCCL peer to peer), so the numbers show
what the composition costs, not what InfiniBand costs; compare them with the cost model for
the same shape (`hybridcomm model --nodes 2 --gpus-per-node <ranks_per_node> --net-gbps
<NCCL's NVLink bandwidth> --hop-us 0`).

Records have the formats of `bench ops` and `bench transitions` (same reports):
  all_reduce over the world, 2 KB - 64 MB: hybridcomm (the Communicator: hierarchical, the
    table's choice), hier_one_shot / hier_two_shot (forced), nccl, nccl_symm;
  gather_tokens / scatter_tokens, hidden 4096 bf16, 1-1024 tokens per DP rank and one
    imbalanced case: hybridcomm, hc_two_step (the two steps through our ops, two_step.py), nccl, nccl_symm,
    and the fused norm against NCCL's all-reduce + norm + all-gather.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from types import SimpleNamespace

import torch
import torch.distributed as dist

from ..communicator import Communicator
from ..layout import Layout
from . import ops, timing, transitions
from .baselines import NcclSymmetricBuffers

TOKENS = [1, 4, 16, 64, 256, 1024]
AR_IMPLS = ("hybridcomm", "nccl", "nccl_symm")


def _time(calls: dict, nbytes: int) -> tuple[list[str], list[float]]:
    names = sorted(calls)
    return names, timing.max_over_ranks([timing.graph_us(calls[k], timing.calls_per_graph(nbytes)) for k in names])


def _log(msg: str) -> None:
    if dist.get_rank() == 0:
        print(msg, file=sys.stderr, flush=True)


def sweep_all_reduce(ranks_per_node: int, sizes: list[int]) -> dict:
    """Worker entry (every rank)."""
    n = dist.get_world_size()
    comm = Communicator(Layout(n, ranks_per_node=ranks_per_node))
    hier, world = comm.backends["hierarchical"], comm.groups["world"]
    symm = NcclSymmetricBuffers([max(sizes)] * 2, comm.device)
    no_symm_mem = SimpleNamespace(buffer=None)  # torch symm_mem needs one host: not a baseline across nodes
    records = []
    for nbytes in sizes:
        calls = {k: v for k, v in ops._calls("all_reduce", nbytes, comm, {}, symm, no_symm_mem).items()
                 if k in AR_IMPLS}
        x = torch.randn(nbytes // 2, dtype=ops.DTYPE, device=comm.device)
        for alg in ("one_shot", "two_shot"):
            calls[f"hier_{alg}"] = lambda alg=alg: hier.all_reduce(x, world, alg)
        names, us = _time(calls, nbytes)
        records += [{"op": "all_reduce", "bytes": nbytes, "impl": k, "us": t,
                     "busbw_GBps": ops.busbw_gbps("all_reduce", nbytes, t, n)} for k, t in zip(names, us)]
        _log(f"[nodes] all_reduce {nbytes:>10} B  " + "  ".join(f"{k} {t:.1f}" for k, t in zip(names, us)))
    return {"environment": timing.environment(), "world_size": n, "ranks_per_node": ranks_per_node,
            "dtype": str(ops.DTYPE), "nccl_symm_note": symm.error, "records": records}


def sweep_transitions(ranks_per_node: int, layout_names: list[str], tokens: list[int]) -> dict:
    """Worker entry (every rank)."""
    device = torch.device("cuda", torch.cuda.current_device())
    most = max(tokens + [transitions.IMBALANCED]) * dist.get_world_size() * transitions.HIDDEN * 2
    symm = NcclSymmetricBuffers([most] * 3, device)
    plain = [torch.empty(most, dtype=torch.uint8, device=device) for _ in range(4)]
    no_symm_mem = SimpleNamespace(buffer=None)  # torch symm_mem needs one host: not a baseline across nodes
    records = []
    for name in layout_names:
        layout = replace(Layout.parse(name), ranks_per_node=ranks_per_node)
        comm = Communicator(layout)
        cases = [("balanced", [t] * layout.attn_dp) for t in tokens]
        if layout.attn_dp > 1:
            cases.append(("imbalanced", [transitions.IMBALANCED] + [1] * (layout.attn_dp - 1)))
        for label, counts in cases:
            for op in ("gather_tokens", "scatter_tokens"):
                names, us = _time(transitions._calls(op, counts, comm, {}, symm, plain, no_symm_mem),
                                  sum(counts) * transitions.HIDDEN * 2)
                records += [{"layout": f"{layout.name} ({ranks_per_node}/node)", "op": op, "case": label,
                             "tokens_per_dp": counts, "impl": k, "us": t} for k, t in zip(names, us)]
                _log(f"[nodes] {layout.name} {op} {counts}: " + "  ".join(f"{k} {t:.1f}" for k, t in zip(names, us)))
    return {"environment": timing.environment(), "hidden": transitions.HIDDEN, "dtype": str(transitions.DTYPE),
            "ranks_per_node": ranks_per_node, "nccl_symm_note": symm.error, "records": records}


def bench_nodes(world_size: int, ranks_per_node: int, layouts: list[str], sizes: list[int] | None = None,
                tokens: list[int] | None = None, timeout_s: float = 900.0) -> tuple[dict, dict]:
    """(all_reduce results, transition results) on `world_size` spawned GPU ranks."""
    from ..spmd import SpmdPool

    with SpmdPool(world_size, "cuda") as pool:
        reduce = pool.run(sweep_all_reduce, ranks_per_node, sizes or ops.DEFAULT_SIZES, timeout=timeout_s)[0]
        moves = pool.run(sweep_transitions, ranks_per_node, layouts, tokens or TOKENS, timeout=timeout_s)[0]
    return reduce, moves
