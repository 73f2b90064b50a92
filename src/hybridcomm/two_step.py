"""The token transitions as two of the communicator's own row ops: algorithm "two_step" of
gather_tokens and scatter_tokens (ops.OPS), which the selection table names like a kernel.

    gather_tokens:  chunk = reduce_scatter_v(x, my group's attn-TP chunks, "attn_tp")
                    out   = all_gather_v(chunk, every (DP group, attn-TP rank)'s chunk, "world")
    scatter_tokens: chunk = reduce_scatter_v(y, every (DP group, attn-TP rank)'s chunk, "world")
                    out   = all_gather_v(chunk, my group's attn-TP chunks, "attn_tp")

A DP group's rows are cut into attn_tp contiguous chunks (arguments.split_evenly), chunk t
for attn-TP rank t, and world order is DP-major, attn-TP-minor, so the gathered chunks are
every group's rows in DP-group order. Each step goes through the Communicator's selection
(subops.run), so it runs the kernel the table picks for its own size: at large sizes every
GPU moves 1/attn_tp of its group's rows once, where the one-kernel transitions push them
from every rank (results/4xH200/transitions: the "hc_unfused" column, this composition).

Same bits as the reference: chunk t of a row is summed over attn-TP (gather) or the world
(scatter) in group order in fp32 and rounded once, by the reduce_scatter_v, exactly as the
reference's transition sums the row; the all_gather_v only moves bits (its fix_reserved
leaves a sum alone: arithmetic never makes the all-ones NaN, reserved.py). partial=False:
nothing to reduce, rank t sends chunk t of its own copy (NCCL's reading of the copies).
attn_tp = 1: the transition is one all_gather_v / reduce_scatter_v over the world.

Device-side counts: the chunk sizes are computed on the device (arguments.split_sizes; no
host sync, capturable), and the steps read them as device sizes, so a graph replays with new
counts. A chunk holds at most ceil(rows / attn_tp) rows, so the intermediate is cut to that
capacity before the all_gather_v: its result, and the message its selection sees, stay the
transition's (not attn_tp times larger). Results have the transition's capacity rows.
Own counts (a Counts holding this DP group's count on the device): the group's chunk sizes are
cut from it on the device, and the all_gather_v step exchanges each rank's chunk count (in its
kernel where the one chosen can, else just before it); every DP group's count, the sum of its
chunks, lands in the Counts for the scatter. The attn-TP ranks of a group must pass the same
count: the reduce_scatter_v's kernel finds differing chunk sizes (partial=True only).
"""

from __future__ import annotations

import torch

from . import subops
from .arguments import Sizes, result_rows, split_sizes


class TwoStep:
    def __init__(self, comm):
        self.comm, self.groups = comm, comm.groups

    def gather_tokens(self, x: torch.Tensor, dp_sizes: Sizes, partial: bool) -> torch.Tensor:
        tp, dp = self.groups["attn_tp"], self.groups["attn_dp"]
        if tp.size == 1:  # (own counts: the all_gather_v learns them, as the DP groups' counts)
            return subops.run(self.comm, "all_gather_v", "world", x, dp_sizes)
        if dp_sizes.own is not None:
            world, mine = _own_chunk_counts(dp_sizes, tp.size, tp.index, self.groups["world"].size)
        else:
            world = split_sizes(dp_sizes, tp.size)
            mine = _member_chunks(world, dp.index, tp.size)
        if partial:
            chunk = subops.run(self.comm, "reduce_scatter_v", "attn_tp", x, mine)
        else:
            chunk = _own_chunk(x, mine, tp.index)
        out = subops.run(self.comm, "all_gather_v", "world", _chunk_capacity(chunk, x.shape[0], mine), world)
        if dp_sizes.own is not None:  # every DP group's count: the sum of its ranks' chunks
            dp_sizes.device.copy_(world.device.view(dp.size, tp.size).sum(1))
        return out[: result_rows(dp_sizes, dp.index, x.shape[0], gathered=True)]

    def scatter_tokens(self, y: torch.Tensor, dp_sizes: Sizes) -> torch.Tensor:
        tp, dp = self.groups["attn_tp"], self.groups["attn_dp"]
        if tp.size == 1:
            return subops.run(self.comm, "reduce_scatter_v", "world", y, dp_sizes)
        world = split_sizes(dp_sizes, tp.size)
        mine = _member_chunks(world, dp.index, tp.size)
        chunk = subops.run(self.comm, "reduce_scatter_v", "world", y, world)
        out = subops.run(self.comm, "all_gather_v", "attn_tp", _chunk_capacity(chunk, y.shape[0], mine), mine)
        return out[: result_rows(dp_sizes, dp.index, y.shape[0], gathered=False)]


def _own_chunk_counts(dp_sizes: Sizes, tp: int, t: int, world: int) -> tuple[Sizes, Sizes]:
    """Own-count mode (counts.py: this DP group's count alone, on the device): my group's chunk
    sizes, cut from it on the device, and the world's chunk sizes as an own-count Sizes holding
    my chunk's count, which the all_gather_v step exchanges (into a new tensor)."""
    mine = split_sizes(Sizes(1, device=dp_sizes.own), tp)
    learned = torch.empty(world, dtype=torch.int32, device=mine.device)
    return Sizes(world, device=learned, own=mine[t: t + 1]), Sizes(tp, device=mine)


def _member_chunks(world: list[int] | torch.Tensor, dp_index: int, tp: int) -> Sizes:
    """The chunk sizes of one DP group's attn-TP ranks (a view of the device tensor, if one)."""
    mine = world[dp_index * tp: (dp_index + 1) * tp]
    return Sizes(tp, device=mine) if isinstance(mine, torch.Tensor) else Sizes(tp, host=tuple(mine))


def _chunk_capacity(chunk: torch.Tensor, rows: int, chunks: Sizes) -> torch.Tensor:
    """Device sizes: the leading ceil(rows / attn_tp) rows of a step's result, which hold every
    chunk of a group of at most `rows` rows (the step's own capacity is `rows`)."""
    if chunks.host is not None:
        return chunk
    return chunk[: -(-rows // chunks.count)]


def _own_chunk(x: torch.Tensor, chunks: Sizes, t: int) -> torch.Tensor:
    """Chunk t of this rank's rows (partial=False). Device sizes: its start is on the device,
    so its rows are copied by a device-side index (clamped: never out of bounds)."""
    if chunks.host is not None:
        start = sum(chunks.host[:t])
        return x[start: start + chunks.host[t]]
    rows = -(-x.shape[0] // chunks.count)
    start = chunks.device[:t].long().sum()
    index = (start + torch.arange(rows, device=x.device)).clamp(max=max(x.shape[0] - 1, 0))
    return x.index_select(0, index)
