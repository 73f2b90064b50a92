"""Eager (no graph) wall-clock cost of one small call of every op through the Communicator,
next to the torch.distributed call an engine makes for the same data (DESIGN.md's "eager
call" target). Rows: 1 token of hidden 1024 per rank, bf16 (2 KB): the cost is Python,
checks and launch, not bytes. Needs GPUs (the world of `comm`, attn_tp = 1)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import timing


def eager_calls(comm, dtype=torch.bfloat16, hidden: int = 1024) -> dict:
    """op -> (our call, the torch.distributed call an engine makes for the same data)."""
    n, device = comm.layout.world_size, comm.device
    x = torch.randn(1, hidden, dtype=dtype, device=device)
    y = torch.randn(n, hidden, dtype=dtype, device=device)
    w = torch.ones(hidden, dtype=dtype, device=device)
    ones = [1] * n
    gathered, scattered = torch.empty_like(y), torch.empty_like(x)
    return {
        "all_reduce": (lambda: comm.all_reduce(x), lambda: dist.all_reduce(x)),
        "all_gather_v": (lambda: comm.all_gather_v(x, ones), lambda: dist.all_gather_into_tensor(gathered, x)),
        "reduce_scatter_v": (lambda: comm.reduce_scatter_v(y, ones),
                             lambda: dist.reduce_scatter_tensor(scattered, y)),
        "gather_tokens": (lambda: comm.gather_tokens(x, [1] * comm.layout.attn_dp),
                          lambda: dist.all_gather_into_tensor(gathered, x)),
        "gather_tokens+norm": (lambda: comm.gather_tokens(x, [1] * comm.layout.attn_dp, residual=x,
                                                          norm_weight=w, eps=1e-6),
                               lambda: dist.all_gather_into_tensor(gathered, x)),
        "scatter_tokens": (lambda: comm.scatter_tokens(y[:comm.layout.attn_dp], [1] * comm.layout.attn_dp),
                           lambda: dist.reduce_scatter_tensor(scattered, y)),
    }


def eager_costs(comm, dtype=torch.bfloat16, hidden: int = 1024) -> dict:
    out = {}
    for op, (ours, theirs) in eager_calls(comm, dtype, hidden).items():
        out[f"hybridcomm_{op}"] = timing.eager_us(ours)
        out[f"torch.distributed_{op}"] = timing.eager_us(theirs)
    return out
