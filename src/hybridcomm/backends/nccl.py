"""NCCL through torch.distributed: the baseline engines use today, and the fallback for
sizes and groups where our kernels do not win (or cannot run: across nodes).

The token transitions are the two-collective sequences SGLang runs:
gather_tokens = reduce-scatter(attn-TP) + all-gather(world); scatter_tokens =
reduce-scatter(world) + all-gather(attn-TP). With one DP group (pure attention TP) both are
one all-reduce over the world instead, the engines' path there (one_all_reduce). Uneven
all-gather / reduce-scatter use torch's list APIs, which NCCL runs as grouped broadcasts /
reduces.

Results agree with the reference within rounding (NCCL reduces in its own order and
in the input dtype), not bit for bit. The fused transition's residual add + RMSNorm runs as
one kernel between the collectives, as engines run theirs (engine_add_rms_norm).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .. import build, collectives, kernels
from ..arguments import Sizes, result_rows, split_evenly
from ..groups import Group
from ..norm import add_rms_norm
from ..quant import QuantizedRows
from ..quant.reference import quantized_move
from .reference import pad_rows


def engine_add_rms_norm(reduced: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                        out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """norm.add_rms_norm as engines run it between their collectives: one fused kernel (vLLM's
    fused_add_rms_norm, FlashInfer's fused_add_rmsnorm; ours, kernels.add_rms_norm, stands in
    for theirs). Its torch ops took 13 kernels and 21-73 µs a call on an H100 against 2.6-5.3 µs
    fused (scripts/norm_baseline.py), which made the NCCL baseline slower than an engine's. They
    still run where the kernel cannot: tensors it does not take, or no kernel library built
    (this never starts an nvcc build)."""
    if kernels.add_rms_norm_fits(reduced, residual, weight, out) and _kernel_library_built():
        return kernels.add_rms_norm(reduced, residual, weight, eps, out)
    return add_rms_norm(reduced, residual, weight, eps, out)


_built = False  # the kernel library was found once (it stays)


def _kernel_library_built() -> bool:
    global _built
    _built = _built or build.find(build.device_arch()) is not None
    return _built


def _host_counts(sizes: Sizes) -> list[int]:
    if sizes.on_device and torch.cuda.is_current_stream_capturing():
        raise ValueError("the nccl backend needs sizes as a list of ints inside CUDA graph "
                         "capture (it cannot read device-side sizes); use the nvlink backend "
                         "for graphs that replay with new counts")
    return list(sizes.values())


def all_gather_rows(x: torch.Tensor, counts: list[int], group: Group, out: torch.Tensor | None = None) -> torch.Tensor:
    """Member i's first counts[i] rows, concatenated; into `out` (sum(counts) rows) if given."""
    row_shape = tuple(x.shape[1:])
    out = x.new_empty((sum(counts),) + row_shape) if out is None else out
    mine = x[: counts[group.index]]
    if group.size == 1:
        out.copy_(mine)
    elif len(set(counts)) == 1:
        collectives.all_gather_single(out, mine, group=group.pg)
    else:
        dist.all_gather(list(out.split(counts)), mine, group=group.pg)
    return out


def reduce_scatter_rows(x: torch.Tensor, counts: list[int], group: Group, out: torch.Tensor | None = None) -> torch.Tensor:
    """Rows of member i's slice summed over the group; into `out` if given."""
    total = sum(counts)
    out = x.new_empty((counts[group.index],) + tuple(x.shape[1:])) if out is None else out
    if group.size == 1:
        out.copy_(x[:total])
    elif len(set(counts)) == 1:
        collectives.reduce_scatter_single(out, x[:total], group=group.pg)
    else:
        dist.reduce_scatter(out, list(x[:total].split(counts)), group=group.pg)
    return out


def all_reduce_copy(x: torch.Tensor, group: Group) -> torch.Tensor:
    out = x.clone()
    if group.size > 1:
        dist.all_reduce(out, group=group.pg)
    return out


def one_all_reduce(groups: dict[str, Group]) -> bool:
    """Whether the engines run a transition as one all-reduce over the world: with one DP group
    (pure attention TP) the summed rows are the whole result, so vLLM and SGLang all-reduce
    them (the two-collective sequences cost 2.2-2.7x that at TP4, 1 token, on 4x H200: bench
    transitions' nccl against nccl_ar)."""
    return groups["attn_dp"].size == 1


# -- the engines' two-collective transitions (also the benchmarks' baselines, on their buffers) --
def gather_tokens_two_step(x: torch.Tensor, counts: list[int], groups: dict[str, Group], partial: bool = True,
                           chunk_out: torch.Tensor | None = None, out: torch.Tensor | None = None, quant=None):
    """reduce-scatter(attn-TP) + all-gather(world): sum(counts) rows. x holds this DP group's
    counts[d] rows (partial over attn-TP, or replicated); chunk_out (this rank's chunk) and
    out (the result) are buffers to use, new tensors if None. With `quant` (a QuantSpec; then
    out must be None): each rank quantizes its chunk, then the data and the scales are
    all-gathered (QuantizedRows)."""
    tp, dp, world = groups["attn_tp"], groups["attn_dp"], groups["world"]
    mine = x[: counts[dp.index]]
    chunks = split_evenly(mine.shape[0], tp.size)
    start = sum(chunks[: tp.index])
    if not partial:
        chunk = mine[start : start + chunks[tp.index]]
    elif tp.size > 1:
        chunk = reduce_scatter_rows(mine, chunks, tp, out=chunk_out)
    else:
        chunk = mine
    world_counts = [c for n in counts for c in split_evenly(n, tp.size)]
    return quantized_move(chunk, quant, lambda t: all_gather_rows(t, world_counts, world, out=out))


def gather_tokens_norm_two_step(x: torch.Tensor, counts: list[int], groups: dict[str, Group], fusion,
                                partial: bool = True, quant=None):
    """The engines' fused path: all-reduce(attn-TP), add + RMSNorm, (quantize,) all-gather(DP).
    Returns (normed rows of every DP group, this group's residual_out)."""
    tp, dp = groups["attn_tp"], groups["attn_dp"]
    mine = x[: counts[dp.index]]
    reduced = all_reduce_copy(mine, tp) if partial else mine
    normed, residual_out = engine_add_rms_norm(reduced, fusion.residual[: mine.shape[0]], fusion.weight, fusion.eps)
    return quantized_move(normed, quant, lambda t: all_gather_rows(t, counts, dp)), residual_out


def scatter_tokens_two_step(y: torch.Tensor, counts: list[int], groups: dict[str, Group],
                            chunk_out: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """reduce-scatter(world) + all-gather(attn-TP): this DP group's counts[d] rows, summed.
    chunk_out / out: buffers as in gather_tokens_two_step."""
    tp, dp, world = groups["attn_tp"], groups["attn_dp"], groups["world"]
    world_counts = [c for n in counts for c in split_evenly(n, tp.size)]
    chunk = reduce_scatter_rows(y, world_counts, world, out=chunk_out)
    if tp.size == 1:
        return chunk
    return all_gather_rows(chunk, split_evenly(counts[dp.index], tp.size), tp, out=out)


def pad_any(result, rows: int):
    """pad_rows for a tensor or for QuantizedRows (data and scales alike)."""
    if isinstance(result, QuantizedRows):
        return result.map_rows(lambda t: pad_rows(t, rows))
    return pad_rows(result, rows)


class NcclBackend:
    name = "nccl"

    def __init__(self, groups: dict[str, Group]):
        self.groups = groups

    def all_reduce(self, x, group, algorithm=None):
        return all_reduce_copy(x, group)

    def all_gather_v(self, x, sizes: Sizes, group: Group, algorithm=None, quant=None):
        counts = _host_counts(sizes)
        out = quantized_move(x[: counts[group.index]], quant, lambda t: all_gather_rows(t, counts, group))
        return pad_any(out, result_rows(sizes, group.index, x.shape[0], gathered=True))

    def reduce_scatter_v(self, x, sizes: Sizes, group: Group, algorithm=None):
        out = reduce_scatter_rows(x, _host_counts(sizes), group)
        return pad_rows(out, result_rows(sizes, group.index, x.shape[0], gathered=False))

    def gather_tokens(self, x, dp_sizes: Sizes, partial: bool, fusion=None, algorithm=None, quant=None):
        dp = self.groups["attn_dp"]
        counts = _host_counts(dp_sizes)
        gathered = result_rows(dp_sizes, dp.index, x.shape[0], gathered=True)
        if fusion is None and partial and quant is None and one_all_reduce(self.groups):
            return pad_rows(all_reduce_copy(x[: counts[0]], self.groups["world"]), gathered)
        if fusion is None:
            return pad_any(gather_tokens_two_step(x, counts, self.groups, partial, quant=quant), gathered)
        normed, residual_out = gather_tokens_norm_two_step(x, counts, self.groups, fusion, partial, quant)
        return pad_any(normed, gathered), pad_rows(residual_out, result_rows(dp_sizes, dp.index, x.shape[0], False))

    def scatter_tokens(self, y, dp_sizes: Sizes, algorithm=None):
        dp = self.groups["attn_dp"]
        counts = _host_counts(dp_sizes)
        if one_all_reduce(self.groups):
            mine = all_reduce_copy(y[: counts[0]], self.groups["world"])
        else:
            mine = scatter_tokens_two_step(y, counts, self.groups)
        return pad_rows(mine, result_rows(dp_sizes, dp.index, y.shape[0], gathered=False))
