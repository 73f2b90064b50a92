"""`hybridcomm bench transitions`: gather_tokens / scatter_tokens at hidden 4096 bf16,
tokens per DP rank 1-512, balanced and imbalanced, everything in the same run.

Columns (µs per call, graph replay, median, max over ranks):
  nccl         the two-kernel sequences engines run: gather = RS(attn-TP) + AG(world),
               scatter = RS(world) + AG(attn-TP) (uneven counts: NCCL grouped ops)
  nccl_symm    the same on NCCL symmetric-window buffers
  hc_one_shot, hc_two_shot, hc_one_shot_lamport   our single-kernel transitions, each forced
  hc_two_step  the same two steps as nccl through our reduce_scatter_v / all_gather_v, each
               choosing its kernel by the table (two_step.py), forced like the others (results
               before it existed call this column hc_unfused; tune reads both)
  hybridcomm   the Communicator's choice
  hc_sms<N>    with --max-sms: the Communicator made with max_sms=N (its choice, at most N blocks)
  nccl_norm / hc_norm  gather with residual add + RMSNorm: AR(attn-TP) + norm + AG(DP)
               in NCCL and torch, against the Communicator's choice of our fused kernels
  hc_fused, hc_fused_lamport   the fused gather forced to each algorithm (LL, Lamport)
  nccl_ar, nccl_symm_ar, symm_one_shot_ar   pure attention TP (attn_dp = 1) only: both
               transitions are one all-reduce there, which is what engines run (NCCL, NCCL on
               symmetric windows, torch symm_mem one-shot as the stand-in for vLLM / SGLang
               custom all-reduce); baselines like the others
With --share-gpus (ranks sharing a GPU, under MPS) only the hc_<algorithm> columns run
(bench/shared.py): for comparing two builds of our kernels, not a speed claim.
"""

from __future__ import annotations

import sys
from functools import partial

import torch
import torch.distributed as dist

from ..arguments import Sizes, split_evenly
from ..backends import nccl
from ..communicator import Communicator
from ..layout import Layout
from ..norm import ResidualNorm
from ..two_step import TwoStep
from . import shared, timing
from .baselines import NcclSymmetricBuffers, SymmMemBuffer, baseline_buffers
from .ops import add_forced_calls, budget_communicators, forced_communicators

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


def _all_reduce_calls(rows: int, symm: NcclSymmetricBuffers, sm: SymmMemBuffer, plain: torch.Tensor) -> dict:
    """Pure attention TP: a transition is one all-reduce of all rows (the engines' path)."""
    calls = {}
    x = plain[: rows * HIDDEN * 2].view(DTYPE).normal_()  # its own buffer: NCCL reduces in place
    calls["nccl_ar"] = lambda: dist.all_reduce(x)
    if symm.buffers is not None:
        xs = symm.view(0, (rows, HIDDEN), DTYPE)
        calls["nccl_symm_ar"] = lambda: dist.all_reduce(xs)
    if sm.buffer is not None:
        xm = sm.view(rows * HIDDEN, DTYPE).normal_()
        calls["symm_one_shot_ar"] = lambda: sm.one_shot(xm)
    return calls


def _calls(op: str, counts: list[int], comm: Communicator, forced_comms: dict, symm: NcclSymmetricBuffers,
           plain: list[torch.Tensor], sm: SymmMemBuffer):
    g, layout, device = comm.groups, comm.layout, comm.device
    mine = counts[g["attn_dp"].index]
    total = sum(counts)
    # Without forced Communicators (bench nodes passes none) hc_two_step is the composition on comm.
    dp_sizes, composed = Sizes(layout.attn_dp, host=tuple(counts)), TwoStep(comm)

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
        add_forced_calls(calls, op, forced_comms, lambda c: c.gather_tokens(x, counts))
        if not forced_comms:
            calls["hc_two_step"] = lambda: composed.gather_tokens(x, dp_sizes, True)
        calls["hybridcomm"] = lambda: comm.gather_tokens(x, counts)
        residual = torch.randn(mine, HIDDEN, dtype=DTYPE, device=device)
        weight = torch.randn(HIDDEN, dtype=DTYPE, device=device)
        fusion = ResidualNorm(residual, weight, 1e-6)
        calls["nccl_norm"] = lambda: nccl.gather_tokens_norm_two_step(x, counts, g, fusion)
        calls["hc_norm"] = lambda: comm.gather_tokens(x, counts, residual=residual, norm_weight=weight)
        add_forced_calls(calls, "gather_tokens_norm", forced_comms,
                         lambda c: c.gather_tokens(x, counts, residual=residual, norm_weight=weight))
    else:
        y = plain_view(0, (total, HIDDEN)).normal_()
        calls["nccl"] = partial(_two_step(op, comm, counts, plain_view), y)
        if symm.buffers is not None:
            calls["nccl_symm"] = partial(_two_step(op, comm, counts, symm_view), symm_view(0, (total, HIDDEN)).normal_())
        add_forced_calls(calls, op, forced_comms, lambda c: c.scatter_tokens(y, counts))
        if not forced_comms:
            calls["hc_two_step"] = lambda: composed.scatter_tokens(y, dp_sizes)
        calls["hybridcomm"] = lambda: comm.scatter_tokens(y, counts)
    if layout.attn_dp == 1:
        calls.update(_all_reduce_calls(total, symm, sm, plain[3]))
    return calls


def sweep_transitions(layout_names: list[str], tokens: list[int] | None = None, max_sms: tuple[int, ...] = (),
                      share_gpus: bool = False) -> dict:
    """Worker entry (every rank). max_sms: also the Communicator made with each (columns hc_sms<N>).
    share_gpus: ranks share a GPU (bench/shared.py): our forced algorithms only."""
    records = []
    device = torch.device("cuda", torch.cuda.current_device())
    symm, sm = baseline_buffers([BUFFER_BYTES] * 3, BUFFER_BYTES, device, share_gpus)
    plain = [torch.empty(BUFFER_BYTES, dtype=torch.uint8, device=device) for _ in range(4)]
    own = {"workspace_bytes": 32 << 20}  # room for 512 tokens per rank
    own.update({"max_sms": shared.sm_share(dist.get_world_size())} if share_gpus else {})
    for name in layout_names:
        layout = Layout.parse(name)
        comm = Communicator(layout, **own)
        forced_ops = list(OPS) + ["gather_tokens_norm"]
        forced_comms = {**forced_communicators(layout, forced_ops, **own),
                        **budget_communicators(layout, list(OPS), max_sms, workspace_bytes=32 << 20)}
        for label, counts in token_cases(layout, tokens or TOKENS):
            for op in OPS:
                calls = _calls(op, counts, comm, forced_comms, symm, plain, sm)
                calls = shared.ours_only(calls, forced_comms) if share_gpus else calls
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
    results = {"environment": timing.environment(), "hidden": HIDDEN, "dtype": str(DTYPE),
               "nccl_symm_note": symm.error, "symm_mem_note": sm.error, "records": records}
    if share_gpus:
        results["shared_gpu"] = shared.description(dist.get_world_size())
    return results


def bench_transitions(layouts: list[str], world_size: int = 4, tokens: list[int] | None = None,
                      timeout_s: float = 900.0, max_sms: tuple[int, ...] = (), share_gpus: bool = False) -> dict:
    from ..spmd import SpmdPool

    with SpmdPool(world_size, "cuda", share_gpus=share_gpus) as pool:
        return pool.run(sweep_transitions, layouts, tokens, tuple(max_sms), share_gpus, timeout=timeout_s)[0]
