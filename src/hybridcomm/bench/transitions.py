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

import torch
import torch.distributed as dist

from ..arguments import parse_sizes, split_evenly
from ..backends.nccl import all_gather_rows, reduce_scatter_rows
from ..communicator import Communicator
from ..layout import Layout
from ..norm import ResidualNorm
from . import timing
from .baselines import NcclSymmetricBuffers

HIDDEN = 4096
DTYPE = torch.bfloat16
TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
IMBALANCED = 64  # one DP rank with 64 tokens, the others with 1
BUFFER_BYTES = 512 * 8 * HIDDEN * 2  # enough for 512 tokens on each of 8 DP ranks


def token_cases(layout: Layout) -> list[tuple[str, list[int]]]:
    """(label, tokens per DP rank): balanced sweep, then the imbalanced case and the
    balanced case with the same total."""
    dp = layout.attn_dp
    cases = [("balanced", [t] * dp) for t in TOKENS]
    if dp > 1:
        uneven = [IMBALANCED] + [1] * (dp - 1)
        cases += [("imbalanced", uneven), ("same_total", split_evenly(sum(uneven), dp)[::-1])]
    return cases


class TwoStepBaseline:
    """The engines' two-collective transitions on given buffers (plain or NCCL-registered)."""

    def __init__(self, comm: Communicator, view):
        self.comm, self.view = comm, view  # view(index, shape) -> tensor on a buffer

    def gather(self, x, counts):
        g, tp = self.comm.groups, self.comm.layout.attn_tp
        mine = counts[g["attn_dp"].index]
        chunks = split_evenly(mine, tp)
        chunk = self.view(1, (chunks[g["attn_tp"].index], HIDDEN))
        if tp > 1:
            reduce_scatter_rows(x, chunks, g["attn_tp"], out=chunk)
        else:
            chunk = x
        world_counts = [c for n in counts for c in split_evenly(n, tp)]
        return all_gather_rows(chunk, world_counts, g["world"], out=self.view(2, (sum(counts), HIDDEN)))

    def scatter(self, y, counts):
        g, tp = self.comm.groups, self.comm.layout.attn_tp
        world_counts = [c for n in counts for c in split_evenly(n, tp)]
        mine = counts[g["attn_dp"].index]
        chunk = reduce_scatter_rows(y, world_counts, g["world"], out=self.view(1, (world_counts[g["world"].index], HIDDEN)))
        if tp == 1:
            return chunk
        return all_gather_rows(chunk, split_evenly(mine, tp), g["attn_tp"], out=self.view(2, (mine, HIDDEN)))


def _calls(op: str, counts: list[int], comm: Communicator, symm: NcclSymmetricBuffers, plain: list[torch.Tensor]):
    g, layout = comm.groups, comm.layout
    nvlink, device = comm.backends["nvlink"], comm.device
    mine = counts[g["attn_dp"].index]
    total = sum(counts)
    tp_chunks = split_evenly(mine, layout.attn_tp)
    world_counts = [c for n in counts for c in split_evenly(n, layout.attn_tp)]
    sizes = parse_sizes(counts, layout.attn_dp, device, "dp_sizes")

    def plain_view(i, shape):
        return plain[i][: shape[0] * shape[1] * 2].view(DTYPE).view(shape)

    calls = {}
    nccl = TwoStepBaseline(comm, plain_view)
    if op == "gather_tokens":
        x = plain_view(0, (mine, HIDDEN)).normal_()
        calls["nccl"] = lambda: nccl.gather(x, counts)
        if symm.buffers is not None:
            xs = symm.view(0, (mine, HIDDEN), DTYPE).normal_()
            symm_base = TwoStepBaseline(comm, lambda i, shape: symm.view(i, shape, DTYPE))
            calls["nccl_symm"] = lambda: symm_base.gather(xs, counts)
        if layout.attn_tp > 1:
            calls["hc_unfused"] = lambda: comm.all_gather_v(comm.reduce_scatter_v(x, tp_chunks, "attn_tp"), world_counts)
        else:
            calls["hc_unfused"] = lambda: comm.all_gather_v(x, world_counts)
        for alg in ("one_shot", "two_shot"):
            if nvlink.blocker("gather_tokens", alg, g["world"], x, sizes) is None:
                calls[f"hc_{alg}"] = lambda alg=alg: nvlink.gather_tokens(x, sizes, True, None, alg)
        calls["hybridcomm"] = lambda: comm.gather_tokens(x, counts)
        residual = torch.randn(mine, HIDDEN, dtype=DTYPE, device=device)
        weight = torch.randn(HIDDEN, dtype=DTYPE, device=device)
        nccl_backend = comm.backends["nccl"]
        fusion = ResidualNorm(residual, weight, 1e-6)
        calls["nccl_norm"] = lambda: nccl_backend.gather_tokens(x, sizes, True, fusion)
        calls["hc_norm"] = lambda: comm.gather_tokens(x, counts, residual=residual, norm_weight=weight)
    else:
        y = plain_view(0, (total, HIDDEN)).normal_()
        calls["nccl"] = lambda: nccl.scatter(y, counts)
        if symm.buffers is not None:
            ys = symm.view(0, (total, HIDDEN), DTYPE).normal_()
            symm_base = TwoStepBaseline(comm, lambda i, shape: symm.view(i, shape, DTYPE))
            calls["nccl_symm"] = lambda: symm_base.scatter(ys, counts)
        if layout.attn_tp > 1:
            calls["hc_unfused"] = lambda: comm.all_gather_v(comm.reduce_scatter_v(y, world_counts), tp_chunks, "attn_tp")
        else:
            calls["hc_unfused"] = lambda: comm.reduce_scatter_v(y, world_counts)
        for alg in ("one_shot", "two_shot"):
            if nvlink.blocker("scatter_tokens", alg, g["world"], y, sizes) is None:
                calls[f"hc_{alg}"] = lambda alg=alg: nvlink.scatter_tokens(y, sizes, alg)
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
        for label, counts in token_cases(layout):
            for op in ("gather_tokens", "scatter_tokens"):
                calls = _calls(op, counts, comm, symm, plain)
                names = sorted(calls)
                nbytes = sum(counts) * HIDDEN * 2
                us = timing.max_over_ranks([timing.graph_us(calls[k], timing.calls_per_graph(nbytes)) for k in names])
                for k, t in zip(names, us):
                    records.append({"layout": layout.name, "op": op, "case": label, "tokens_per_dp": counts,
                                    "impl": k, "us": t})
                if dist.get_rank() == 0:
                    row = "  ".join(f"{k} {t:.1f}" for k, t in zip(names, us))
                    print(f"[transitions] {layout.name} {op} {label} {counts}: {row}", file=sys.stderr, flush=True)
        del comm
    return {"environment": timing.environment(), "hidden": HIDDEN, "dtype": str(DTYPE),
            "nccl_symm_note": symm.error, "records": records}


def bench_transitions(layouts: list[str], world_size: int = 4, timeout_s: float = 900.0) -> dict:
    from ..spmd import SpmdPool

    with SpmdPool(world_size, "cuda") as pool:
        return pool.run(sweep_transitions, layouts, timeout=timeout_s)[0]
