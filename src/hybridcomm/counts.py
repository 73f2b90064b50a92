"""Counts from one's own count: an engine knows only how many rows its own rank (DP group)
has this step; `Counts` carries that one number into an op, which exchanges it with the
group and keeps every member's count for the ops that follow.

    counts = hc.Counts(n)                           # or a 1-element int32 device tensor
    moe_in = comm.gather_tokens(attn_out, counts)   # exchanges the counts (over attn_dp)
    counts.sizes                                    # every DP group's count, group order
    mine = comm.scatter_tokens(moe_out, counts)     # reuses them: no second exchange

A device tensor given to a gather (gather_tokens, all_gather_v) that our kernels run is
exchanged inside the kernel: each rank sends its count in a packet beside its arrival packet,
starts sending its rows (which need only its own count), then learns every member's count
from the packets that arrived and places the rows it receives (csrc/own_count.cuh). No extra
launch, no host sync, capturable: a graph replays with new counts. The kernel writes every
member's count into `counts.sizes` (a device int32 tensor), and the op's result has capacity
rows as with device-side sizes. Which algorithms can: `ops.Algorithm.own_count` (the LL and
Lamport one-shots of both gathers, gather_tokens' two-shot and fused norm, and its two_step,
whose all_gather_v step exchanges the chunk counts, and the quantized gathers' kernels, which
learn the counts before their rows rather than after). There the kernel
checks that the attn-TP ranks of each DP group passed the same count (else ArgumentMismatch on
every rank; two_step: on that group's ranks, from its reduce_scatter_v step, and only when
partial) and that every count fits its rank's input rows and the workspace (else
CapacityExceeded on every rank).

Everywhere else -- an int, the reference and NCCL backends, groups across nodes,
`Communicator(validate=True)` (whose check compares every count), a Counts first given to a
scatter -- the count is exchanged before the op, as before: an int through a
small all-gather read back to the host (one sync on GPU; the op then sees host sizes, exactly
as if the caller had passed the list); a device tensor device to device
(`collectives.all_gather_single`: no host sync, capturable, one extra NCCL launch), and the op sees
device sizes (results have capacity rows, see README). Results are the same bits either way.
"""

from __future__ import annotations

import operator

import torch
import torch.distributed as dist

from . import collectives
from .arguments import Sizes, same_device
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


def in_kernel(counts: Counts, group: Group, device: torch.device) -> Sizes | None:
    """Counts whose own device count a gather kernel may exchange: their Sizes in own-count
    mode (`own`, and a new tensor for the kernel to fill with every member's count). None
    where the count is exchanged before the op (exchanged already, an int, another device)."""
    own = counts.own
    if counts.exchanged or not isinstance(own, torch.Tensor) or not same_device(own.device, device):
        return None
    return Sizes(group.size, device=torch.empty(group.size, dtype=torch.int32, device=device), own=own.reshape(1))


def settle(counts: Counts, sizes: Sizes, group: Group, device: torch.device, by_kernel: bool) -> Sizes:
    """After the op's algorithm is chosen: `by_kernel` (its kernel exchanges the count,
    ops.Algorithm.own_count) -> the Counts keeps the tensor the kernel fills; otherwise the
    count is exchanged now, before the op."""
    if by_kernel:
        counts.sizes, counts.group = sizes.device, group.name
        return sizes
    return Sizes(sizes.count, device=exchange(counts, group, device))


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
        sizes = exchange_into(own.reshape(1).to(device), torch.empty(group.size, dtype=torch.int32, device=device),
                              group)
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


def exchange_into(own: torch.Tensor, sizes: torch.Tensor, group: Group) -> torch.Tensor:
    """Every member's 1-element int32 device count into `sizes` (device to device: no host
    sync, capturable, one NCCL launch)."""
    if group.size == 1:
        sizes.copy_(own)
    else:
        collectives.all_gather_single(sizes, own, group=group.pg)
    return sizes
