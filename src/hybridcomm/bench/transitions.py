"""`hybridcomm bench transitions`: gather_tokens / scatter_tokens at hidden 4096 bf16,
tokens per DP rank 1-512, balanced and imbalanced, everything in the same run.

Columns (µs per call, graph replay, median, max over ranks):
  nccl         the two-kernel sequences engines run: gather = RS(attn-TP) + AG(world),
               scatter = RS(world) + AG(attn-TP) (uneven counts: NCCL grouped ops)
  nccl_symm    the same on NCCL symmetric-window buffers
  hc_unfused   the same two steps with our reduce_scatter_v / all_gather_v kernels
  hc_one_shot, hc_two_shot   our single-kernel transitions, each algorithm forced
  hybridcomm   the Communicator's choice
  nccl_norm / hc_norm  gather with residual add + RMSNorm: AR(attn-TP) + norm + AG(DP)
               in NCCL and torch, against our fused kernel
"""

from __future__ import annotations

import sys
from functools import partial

import torch
import torch.distributed as dist

from ..arguments import split_evenly
from ..backends import nccl
from ..communicator import Communicator
from ..layout import Layout
from ..norm import ResidualNorm
from . import timing
from .baselines import NcclSymmetricBuffers
from .ops import add_forced_calls, forced_communicators

HIDDEN = 4096
DTYPE = torch.bfloat16
TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
IMBALANCED = 64  # one DP rank with 64 tokens, the others with 1
OPS = ("gather_tokens", "scatter_tokens")
BUFFER_BYTES = 512 * 8 * HIDDEN * 2  # enough for 512 tokens on each of 8 DP ranks


def token_cases(layout: Layout, tokens: list[int] = TOKENS) -> list[tuple[str, list[int]]]:
    """(label, tokens per DP rank): balanced sweep, then the imbalanced case and the
    balanced case with the same total."""
    dp = layout.attn_dp
    cases = [("balanced", [t] * dp) for t in tokens]
    if dp > 1:
        uneven = [IMBALANCED] + [1] * (dp - 1)
        cases += [("imbalanced", uneven), ("same_total", split_evenly(sum(uneven), dp)[::-1])]
    return cases


def _two_step(op: str, comm: Communicator, counts: list[int], view):
    """The engines' two-collective transition (the NCCL backend's functions) on buffers cut by
    view(index, shape): plain tensors or NCCL-registered ones."""
    g, tp = comm.groups, comm.layout.attn_tp
    mine = counts[g["attn_dp"].index]
    if op == "gather_tokens":
        chunk = view(1, (split_evenly(mine, tp)[g["attn_tp"].index], HIDDEN))
        return lambda x: nccl.gather_tokens_two_step(x, counts, g, chunk_out=chunk, out=view(2, (sum(counts), HIDDEN)))
    world_counts = [c for n in counts for c in split_evenly(n, tp)]
    chunk = view(1, (world_counts[g["world"].index], HIDDEN))
    return lambda y: nccl.scatter_tokens_two_step(y, counts, g, chunk_out=chunk, out=view(2, (mine, HIDDEN)))


def _calls(op: str, counts: list[int], comm: Communicator, forced_comms: dict, symm: NcclSymmetricBuffers,
           plain: list[torch.Tensor]):
    g, layout, device = comm.groups, comm.layout, comm.device
    mine = counts[g["attn_dp"].index]
    total = sum(counts)
    tp_chunks = split_evenly(mine, layout.attn_tp)
    world_counts = [c for n in counts for c in split_evenly(n, layout.attn_tp)]

    def plain_view(i, shape):
        return plain[i][: shape[0] * shape[1] * 2].view(DTYPE).view(shape)

    def symm_view(i, shape):
        return symm.view(i, shape, DTYPE)

    calls = {}
    if op == "gather_tokens":
        x = plain_view(0, (mine, HIDDEN)).normal_()
        calls["nccl"] = partial(_two_step(op, comm, counts, plain_view), x)
        if symm.buffers is not None:
            calls["nccl_symm"] = partial(_two_step(op, comm, counts, symm_view), symm_view(0, (mine, HIDDEN)).normal_())
        if layout.attn_tp > 1:
            calls["hc_unfused"] = lambda: comm.all_gather_v(comm.reduce_scatter_v(x, tp_chunks, "attn_tp"), world_counts)
        else:
            calls["hc_unfused"] = lambda: comm.all_gather_v(x, world_counts)
        add_forced_calls(calls, op, forced_comms, lambda c: c.gather_tokens(x, counts))
        calls["hybridcomm"] = lambda: comm.gather_tokens(x, counts)
        residual = torch.randn(mine, HIDDEN, dtype=DTYPE, device=device)
        weight = torch.randn(HIDDEN, dtype=DTYPE, device=device)
        fusion = ResidualNorm(residual, weight, 1e-6)
        calls["nccl_norm"] = lambda: nccl.gather_tokens_norm_two_step(x, counts, g, fusion)
        calls["hc_norm"] = lambda: comm.gather_tokens(x, counts, residual=residual, norm_weight=weight)
    else:
        y = plain_view(0, (total, HIDDEN)).normal_()
        calls["nccl"] = partial(_two_step(op, comm, counts, plain_view), y)
        if symm.buffers is not None:
            calls["nccl_symm"] = partial(_two_step(op, comm, counts, symm_view), symm_view(0, (total, HIDDEN)).normal_())
        if layout.attn_tp > 1:
            calls["hc_unfused"] = lambda: comm.all_gather_v(comm.reduce_scatter_v(y, world_counts), tp_chunks, "attn_tp")
        else:
            calls["hc_unfused"] = lambda: comm.reduce_scatter_v(y, world_counts)
        add_forced_calls(calls, op, forced_comms, lambda c: c.scatter_tokens(y, counts))
        calls["hybridcomm"] = lambda: comm.scatter_tokens(y, counts)
    return calls


def sweep_transitions(layout_names: list[str]) -> dict:
    """Worker entry (every rank)."""
    records = []
    device = torch.device("cuda", torch.cuda.current_device())
    symm = NcclSymmetricBuffers([BUFFER_BYTES] * 3, device)
    plain = [torch.empty(BUFFER_BYTES, dtype=torch.uint8, device=device) for _ in range(3)]
    for name in layout_names:
        layout = Layout.parse(name)
        comm = Communicator(layout, workspace_bytes=32 << 20)  # room for 512 tokens per rank
        forced_comms = forced_communicators(layout, list(OPS), workspace_bytes=32 << 20)
        for label, counts in token_cases(layout):
            for op in OPS:
                calls = _calls(op, counts, comm, forced_comms, symm, plain)
                names = sorted(calls)
                nbytes = sum(counts) * HIDDEN * 2
                us = timing.max_over_ranks([timing.graph_us(calls[k], timing.calls_per_graph(nbytes)) for k in names])
                for k, t in zip(names, us):
                    records.append({"layout": layout.name, "op": op, "case": label, "tokens_per_dp": counts,
                                    "impl": k, "us": t})
                if dist.get_rank() == 0:
                    row = "  ".join(f"{k} {t:.1f}" for k, t in zip(names, us))
                    print(f"[transitions] {layout.name} {op} {label} {counts}: {row}", file=sys.stderr, flush=True)
        del comm, forced_comms
    return {"environment": timing.environment(), "hidden": HIDDEN, "dtype": str(DTYPE),
            "nccl_symm_note": symm.error, "records": records}


def bench_transitions(layouts: list[str], world_size: int = 4, timeout_s: float = 900.0) -> dict:
    from ..spmd import SpmdPool

    with SpmdPool(world_size, "cuda") as pool:
        return pool.run(sweep_transitions, layouts, timeout=timeout_s)[0]
