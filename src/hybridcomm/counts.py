"""Counts from one's own count: an engine knows only how many rows its own rank (DP group)
has this step; `Counts` carries that one number into an op, which exchanges it with the
group and keeps every member's count for the ops that follow.

    counts = hc.Counts(n)                           # or a 1-element int32 device tensor
    moe_in = comm.gather_tokens(attn_out, counts)   # exchanges the counts (over attn_dp)
    counts.sizes                                    # every DP group's count, group order
    mine = comm.scatter_tokens(moe_out, counts)     # reuses them: no second exchange

An int is exchanged through a small all-gather and read back to the host (one sync on
GPU): the op then sees host sizes, exactly as if the caller had passed the list. A device
tensor is exchanged device to device (`all_gather_into_tensor`, no host sync, capturable in
a CUDA graph) and the op sees device sizes (results have capacity rows, see README).
Not done yet: exchanging the count inside our kernels' first packet (no extra launch).
"""

from __future__ import annotations

import operator

import torch
import torch.distributed as dist

from .groups import Group


class Counts:
    """This rank's own row count; after the first op that takes it, every member's count.

    own: a non-negative int, or a 1-element int32 tensor on the communicator's device.
    A Counts is exchanged once, over the group of the first op that receives it (attn_dp
    for gather_tokens, the op's group for all_gather_v); later ops reuse `sizes` and must
    run over a group of the same size. Use a new Counts for every step.
    """

    def __init__(self, own):
        if isinstance(own, torch.Tensor):
            if own.dtype != torch.int32 or own.numel() != 1:
                raise TypeError(f"own: a count tensor must be int32 with one element, got "
                                f"{own.dtype} of shape {tuple(own.shape)}")
        else:
            try:
                value = operator.index(own)
            except TypeError:
                value = -1
            if isinstance(own, bool) or value < 0:
                raise ValueError(f"own: expected a non-negative int or a 1-element int32 tensor, got {own!r}")
            own = value
        self.own = own
        self.sizes: tuple[int, ...] | torch.Tensor | None = None
        self.group: str | None = None

    @property
    def exchanged(self) -> bool:
        return self.sizes is not None

    def __repr__(self) -> str:
        return f"Counts(own={self.own!r}, sizes={self.sizes!r}, group={self.group!r})"


def exchange(counts: Counts, group: Group, device: torch.device):
    """Every member's count over `group` (once; later calls return the stored sizes)."""
    if counts.exchanged:
        size = counts.sizes.numel() if isinstance(counts.sizes, torch.Tensor) else len(counts.sizes)
        if size != group.size:
            raise ValueError(f"sizes: this Counts was exchanged over group {counts.group!r} of {size} "
                             f"members; group {group.name!r} has {group.size} (use a new Counts)")
        return counts.sizes
    own = counts.own
    if isinstance(own, torch.Tensor):
        mine = own.reshape(1).to(device)
        sizes = torch.empty(group.size, dtype=torch.int32, device=device)
        if group.size == 1:
            sizes.copy_(mine)
        else:
            dist.all_gather_into_tensor(sizes, mine, group=group.pg)
    else:
        mine = torch.tensor([own], dtype=torch.int64, device=device)
        if group.size == 1:
            sizes = (own,)
        else:
            gathered = [torch.empty_like(mine) for _ in range(group.size)]
            dist.all_gather(gathered, mine, group=group.pg)
            sizes = tuple(int(v) for v in torch.cat(gathered).tolist())
    counts.sizes, counts.group = sizes, group.name
    return sizes
