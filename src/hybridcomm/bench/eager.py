"""Eager (no graph) cost of one small call of every op through the Communicator, next to the
torch.distributed calls an engine makes for the same data (DESIGN.md's "eager call" target).
Rows: 1 token of hidden 1024 per rank, bf16 (2 KB): the cost is Python, checks and launch, not
bytes. Needs GPUs (the world of `comm`).

Two numbers per call (bench/timing.py):
- wall: µs per call of back-to-back calls, device included (what an eager step pays when the
  host is the bottleneck); it also carries the peers' jitter, since a collective waits for all;
- issue: µs for the host to return from a call, the device idle and nothing synchronised (the
  Python + launch cost alone, independent of the peers).
Ours and theirs alternate within each round, over several rounds; medians are reported.
"""

from __future__ import annotations

import statistics

import torch
import torch.distributed as dist

from .. import collectives
from ..backends.nccl import engine_add_rms_norm
from . import timing

ROUNDS = 7


def _sequence(*steps):
    """One call running `steps` in order (the torch.distributed path of a transition)."""
    steps = [s for s in steps if s]

    def run():
        for step in steps:
            step()
    return run


def eager_calls(comm, dtype=torch.bfloat16, hidden: int = 1024) -> dict:
    """op -> (our call, the torch.distributed calls an engine makes for the same data).

    Theirs for the transitions: all_reduce over attn-TP (where attn_tp > 1), then all_gather
    over attn-DP (where attn_dp > 1), and for scatter_tokens reduce_scatter over attn-DP then
    all_reduce over attn-TP. For the fused gather theirs is what engines launch: the all_reduce,
    the residual add + RMSNorm as one kernel (backends.nccl.engine_add_rms_norm), then the
    all_gather of the normed rows."""
    lay, device = comm.layout, comm.device
    n, dp, tp = lay.world_size, lay.attn_dp, lay.attn_tp
    tp_pg, dp_pg = comm.groups["attn_tp"].pg, comm.groups["attn_dp"].pg
    x = torch.randn(1, hidden, dtype=dtype, device=device)
    y = torch.randn(n, hidden, dtype=dtype, device=device)
    w = torch.ones(hidden, dtype=dtype, device=device)
    ones = [1] * n
    # theirs: own buffers (their all-reduces work in place)
    xt, yt = x.clone(), y.clone()
    gathered, scattered = torch.empty_like(y), torch.empty_like(x)
    gathered_dp, y_dp, yt_dp = torch.empty(dp, hidden, dtype=dtype, device=device), y[:dp], yt[:dp]
    normed = torch.empty_like(x)
    their_gather = _sequence(tp > 1 and (lambda: dist.all_reduce(xt, group=tp_pg)),
                             dp > 1 and (lambda: collectives.all_gather_single(gathered_dp, xt, group=dp_pg)))
    their_fused_gather = _sequence(tp > 1 and (lambda: dist.all_reduce(xt, group=tp_pg)),
                                   lambda: engine_add_rms_norm(xt, x, w, 1e-6, out=normed),
                                   dp > 1 and (lambda: collectives.all_gather_single(gathered_dp, normed, group=dp_pg)))
    their_scatter = _sequence(dp > 1 and (lambda: collectives.reduce_scatter_single(scattered, yt_dp, group=dp_pg)),
                              tp > 1 and (lambda: dist.all_reduce(scattered if dp > 1 else yt_dp, group=tp_pg)))
    return {
        "all_reduce": (lambda: comm.all_reduce(x), lambda: dist.all_reduce(xt)),
        "all_gather_v": (lambda: comm.all_gather_v(x, ones), lambda: collectives.all_gather_single(gathered, xt)),
        "reduce_scatter_v": (lambda: comm.reduce_scatter_v(y, ones),
                             lambda: collectives.reduce_scatter_single(scattered, yt)),
        "gather_tokens": (lambda: comm.gather_tokens(x, [1] * dp), their_gather),
        "gather_tokens+norm": (lambda: comm.gather_tokens(x, [1] * dp, residual=x, norm_weight=w, eps=1e-6),
                               their_fused_gather),
        "scatter_tokens": (lambda: comm.scatter_tokens(y_dp, [1] * dp), their_scatter),
    }


def eager_table(comm, rounds: int = ROUNDS, calls: int = 100, issue_calls: int = timing.ISSUE_CALLS,
                dtype=torch.bfloat16, hidden: int = 1024) -> dict:
    """op -> {"ours_wall", "theirs_wall", "ours_issue", "theirs_issue"}: medians over `rounds`
    (µs per call, this rank). Ours and theirs alternate, each going first every other round."""
    samples: dict = {}
    pairs = eager_calls(comm, dtype, hidden)
    for r in range(rounds):
        for op, (ours, theirs) in pairs.items():
            pair = [("ours", ours), ("theirs", theirs)]
            for who, call in pair if r % 2 == 0 else pair[::-1]:
                s = samples.setdefault(op, {})
                s.setdefault(f"{who}_wall", []).append(timing.eager_us(call, calls))
                s.setdefault(f"{who}_issue", []).append(timing.issue_us(call, issue_calls))
    return {op: {k: statistics.median(v) for k, v in s.items()} for op, s in samples.items()}


def eager_costs(comm, dtype=torch.bfloat16, hidden: int = 1024) -> dict:
    """eager_table flattened for a results file: hybridcomm_<op> / torch.distributed_<op> (wall)
    and issue_hybridcomm_<op> / issue_torch.distributed_<op> (host issue), µs per call."""
    out = {}
    for op, t in eager_table(comm, dtype=dtype, hidden=hidden).items():
        out.update({f"hybridcomm_{op}": t["ours_wall"], f"torch.distributed_{op}": t["theirs_wall"],
                    f"issue_hybridcomm_{op}": t["ours_issue"], f"issue_torch.distributed_{op}": t["theirs_issue"]})
    return out


def format_table(table: dict, title: str) -> str:
    """Markdown: one row per op, wall and issue µs for both, and our share of theirs."""
    lines = [f"**{title}** (µs per call, medians; wall: back-to-back calls incl. device and peers; "
             f"issue: host time to return from a call)", "",
             "| op | wall hybridcomm | wall torch.distributed | issue hybridcomm | issue torch.distributed |",
             "|---|---|---|---|---|"]
    for op, t in table.items():
        lines.append(f"| {op} | {t['ours_wall']:.1f} | {t['theirs_wall']:.1f} | {t['ours_issue']:.1f} | "
                     f"{t['theirs_issue']:.1f} |")
    return "\n".join(lines)
