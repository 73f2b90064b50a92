"""The reference backend: every op composed from torch.distributed all_gather.

This is the semantic truth that every fast path is compared with. It moves raw bytes
(so any dtype travels bit-exactly over gloo or NCCL) and reduces locally in fp32, in
group order, then rounds once. Every backend reduces in this order, so a kernel that
does the same produces the same bits, and all ranks holding a value hold the same bits.
It favours obviousness over speed: reductions gather every contribution to every rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..arguments import Sizes, result_rows
from ..errors import CapacityExceeded
from ..groups import Group
from ..norm import add_rms_norm
from ..quant.reference import quantized_move


def sum_in_order(parts: list[torch.Tensor]) -> torch.Tensor:
    """fp32 sum in list order: ((p0 + p1) + p2) + ..."""
    acc = parts[0].float().clone()
    for p in parts[1:]:
        acc += p.float()
    return acc


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


def gather_owned(rows: torch.Tensor, counts: list[int], group: Group, capacity: int, quant=None):
    """Every member's own rows, concatenated and padded to `capacity`; with `quant`, each
    member quantizes its rows first and the quantized bytes travel (QuantizedRows)."""
    def gather(t):
        return pad_rows(torch.cat(gather_rows(t, counts, group)), capacity)

    return quantized_move(rows, quant, gather)


class ReferenceBackend:
    name = "reference"

    def __init__(self, groups: dict[str, Group]):
        self.groups = groups

    def all_reduce(self, x: torch.Tensor, group: Group, algorithm=None) -> torch.Tensor:
        parts = gather_rows(x, [x.shape[0]] * group.size, group)
        return sum_in_order(parts).to(x.dtype)

    def all_gather_v(self, x: torch.Tensor, sizes: Sizes, group: Group, algorithm=None, quant=None):
        counts = host_counts(sizes, group.index, x.shape[0], "all_gather_v")
        return gather_owned(x[: counts[group.index]], counts, group,
                            result_rows(sizes, group.index, x.shape[0], gathered=True), quant)

    def reduce_scatter_v(self, x: torch.Tensor, sizes: Sizes, group: Group, algorithm=None) -> torch.Tensor:
        return _sum_my_rows(x, sizes, group.index, group, "reduce_scatter_v: sizes")

    def gather_tokens(self, x, dp_sizes: Sizes, partial: bool, fusion=None, algorithm=None, quant=None):
        tp, dp = self.groups["attn_tp"], self.groups["attn_dp"]
        counts = host_counts(dp_sizes, dp.index, x.shape[0], "gather_tokens")
        mine = x[: counts[dp.index]]
        reduced = sum_in_order(gather_rows(mine, [mine.shape[0]] * tp.size, tp)) if partial else mine
        residual_out = None
        if fusion is None:
            send = reduced.to(x.dtype)
        else:
            send, residual_out = add_rms_norm(reduced, fusion.residual[: mine.shape[0]],
                                              fusion.weight, fusion.eps)
        out = gather_owned(send, counts, dp, result_rows(dp_sizes, dp.index, x.shape[0], gathered=True), quant)
        if fusion is None:
            return out
        return out, pad_rows(residual_out, result_rows(dp_sizes, dp.index, x.shape[0], gathered=False))

    def scatter_tokens(self, y: torch.Tensor, dp_sizes: Sizes, algorithm=None) -> torch.Tensor:
        # Rows of every DP group summed over the whole world: my DP group's slice of them.
        return _sum_my_rows(y, dp_sizes, self.groups["attn_dp"].index, self.groups["world"], "scatter_tokens: dp_sizes")


def _sum_my_rows(x: torch.Tensor, sizes: Sizes, index: int, over: Group, what: str) -> torch.Tensor:
    """Rows [sum(sizes[:index]), +sizes[index]) of x, summed over the members of `over`."""
    counts = list(sizes.values())
    total = sum(counts)
    if total > x.shape[0]:
        raise CapacityExceeded(f"{what} sum to {total} rows, but the input holds only {x.shape[0]}")
    start = sum(counts[:index])
    parts = gather_rows(x[:total], [total] * over.size, over)
    mine = sum_in_order([p[start : start + counts[index]] for p in parts]).to(x.dtype)
    return pad_rows(mine, result_rows(sizes, index, x.shape[0], gathered=False))
