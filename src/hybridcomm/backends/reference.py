"""The reference backend: every op composed from torch.distributed all_gather.

This is the semantic truth that every fast path is compared with. It moves raw bytes
(so any dtype travels bit-exactly over gloo or NCCL) and reduces locally in fp32, in
group order, then rounds once. Every backend reduces in this order, so a kernel that
does the same produces the same bits, and all ranks holding a value hold the same bits.
It favours obviousness over speed: reductions gather every contribution to every rank.
For a group that spans nodes the order is per node, then over nodes (topology.sum_by_node).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..arguments import Sizes, result_rows
from ..errors import CapacityExceeded
from ..groups import Group
from ..norm import add_rms_norm
from ..topology import sum_by_node


def gather_rows(x: torch.Tensor, counts: list[int], group: Group) -> list[torch.Tensor]:
    """Member i contributes its first counts[i] rows; returns every member's rows."""
    if group.size == 1:
        return [x[: counts[0]]]
    rows_max = max(counts)
    row_shape = tuple(x.shape[1:])
    if rows_max == 0:
        return [x.new_empty((0,) + row_shape) for _ in counts]
    padded = x.new_zeros((rows_max,) + row_shape)
    padded[: counts[group.index]] = x[: counts[group.index]]
    raw = padded.view(-1).view(torch.uint8)
    received = [torch.empty_like(raw) for _ in counts]
    dist.all_gather(received, raw, group=group.pg)
    return [r.view(x.dtype).view((rows_max,) + row_shape)[:c] for r, c in zip(received, counts)]


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x with zero rows appended up to `rows` (the result capacity under device sizes)."""
    if x.shape[0] == rows:
        return x
    if x.shape[0] > rows:
        raise CapacityExceeded(f"the result has {x.shape[0]} rows, but its capacity (derived from "
                               f"the input's rows) is {rows}; give every rank the same capacity")
    out = x.new_zeros((rows,) + tuple(x.shape[1:]))
    out[: x.shape[0]] = x
    return out


def host_counts(sizes: Sizes, index: int, available_rows: int, what: str) -> list[int]:
    counts = list(sizes.values())
    if sizes.on_device and counts[index] > available_rows:
        raise CapacityExceeded(f"{what}: sizes[{index}] = {counts[index]} rows, but the input "
                               f"holds only {available_rows}")
    return counts


class ReferenceBackend:
    name = "reference"

    def __init__(self, groups: dict[str, Group]):
        self.groups = groups

    def all_reduce(self, x: torch.Tensor, group: Group, algorithm=None) -> torch.Tensor:
        parts = gather_rows(x, [x.shape[0]] * group.size, group)
        return sum_by_node(parts, group.nodes, x.dtype).to(x.dtype)

    def all_gather_v(self, x: torch.Tensor, sizes: Sizes, group: Group, algorithm=None) -> torch.Tensor:
        counts = host_counts(sizes, group.index, x.shape[0], "all_gather_v")
        out = torch.cat(gather_rows(x, counts, group))
        return pad_rows(out, result_rows(sizes, group.index, x.shape[0], gathered=True))

    def reduce_scatter_v(self, x: torch.Tensor, sizes: Sizes, group: Group, algorithm=None) -> torch.Tensor:
        counts = list(sizes.values())
        total = sum(counts)
        if total > x.shape[0]:
            raise CapacityExceeded(f"reduce_scatter_v: sizes sum to {total} rows, but the input "
                                   f"holds only {x.shape[0]}")
        start = sum(counts[: group.index])
        parts = gather_rows(x[:total], [total] * group.size, group)
        mine = sum_by_node([p[start : start + counts[group.index]] for p in parts], group.nodes, x.dtype).to(x.dtype)
        return pad_rows(mine, result_rows(sizes, group.index, x.shape[0], gathered=False))

    def gather_tokens(self, x, dp_sizes: Sizes, partial: bool, fusion=None, algorithm=None):
        tp, dp = self.groups["attn_tp"], self.groups["attn_dp"]
        counts = host_counts(dp_sizes, dp.index, x.shape[0], "gather_tokens")
        mine = x[: counts[dp.index]]
        reduced = sum_by_node(gather_rows(mine, [mine.shape[0]] * tp.size, tp), tp.nodes, x.dtype) if partial else mine
        residual_out = None
        if fusion is None:
            send = reduced.to(x.dtype)
        else:
            send, residual_out = add_rms_norm(reduced, fusion.residual[: mine.shape[0]],
                                              fusion.weight, fusion.eps)
        out = pad_rows(torch.cat(gather_rows(send, counts, dp)),
                       result_rows(dp_sizes, dp.index, x.shape[0], gathered=True))
        if fusion is None:
            return out
        return out, pad_rows(residual_out, result_rows(dp_sizes, dp.index, x.shape[0], gathered=False))

    def scatter_tokens(self, y: torch.Tensor, dp_sizes: Sizes, algorithm=None) -> torch.Tensor:
        world, dp = self.groups["world"], self.groups["attn_dp"]
        counts = list(dp_sizes.values())
        total = sum(counts)
        if total > y.shape[0]:
            raise CapacityExceeded(f"scatter_tokens: dp_sizes sum to {total} rows, but the input "
                                   f"holds only {y.shape[0]}")
        start = sum(counts[: dp.index])
        parts = gather_rows(y[:total], [total] * world.size, world)
        mine = sum_by_node([p[start : start + counts[dp.index]] for p in parts], world.nodes, y.dtype).to(y.dtype)
        return pad_rows(mine, result_rows(dp_sizes, dp.index, y.shape[0], gathered=False))
