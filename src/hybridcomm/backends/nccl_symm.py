"""NCCL on symmetric windows: the nccl backend's token transitions with every collective's
input and output in memory registered with NCCL as symmetric windows, so that NCCL >= 2.27
runs its low-latency symmetric kernels. This is what an engine with NCCL symmetric memory
does (vLLM copies a collective's input into a symmetric buffer first, as here; SGLang has
the producing op allocate it there); `hybridcomm bench model` runs it as a baseline.

How the buffers stay legal for NCCL:
- Registering is collective over each process group, and NCCL wants a buffer at the same
  offset of the window on every rank. So the arena's size and layout depend only on what
  every rank shares: a transition's total rows times its row bytes (equal on all ranks by
  the API contract). It grows (a new arena; the old one is kept, a graph may hold its
  addresses) when a transition needs more, up to MAX_SLOT_BYTES a slot; larger transitions
  run on the plain nccl path.
- Registration cannot happen inside CUDA graph capture: the eager run before a capture
  (what every graph user does for lazy setup) sizes the arena; a capture that needs more
  raises ValueError.
- Results are views into a ring of RING slots per transition, not new tensors: a result
  stays valid until RING more calls of the same transition (a decoder layer consumes its
  gather's and scatter's results before the next layer calls them again).

Only gather_tokens and scatter_tokens use the windows (the model's transitions);
all_reduce, all_gather_v and reduce_scatter_v, and quantized gathers, run as on nccl.
Counts must be on the host, as for nccl. Uneven counts run torch's list collectives
(grouped NCCL calls) on the registered buffers, as the nccl path does.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..arguments import result_rows, split_evenly
from ..groups import Group
from .nccl import (NcclBackend, _host_counts, all_gather_rows, engine_add_rms_norm, gather_tokens_two_step,
                   one_all_reduce, scatter_tokens_two_step)
from .reference import pad_rows

RING = 2  # result slots per transition
MIN_SLOT_BYTES = 1 << 20
MAX_SLOT_BYTES = 32 << 20  # beyond this a transition runs on the plain nccl path (prefills)
STAGING = ("input", "send")  # the copy of the caller's tensor, and the all-gather's send rows
RESULTS = ("gather_tokens", "scatter_tokens")


def register_buffers(nbytes: list[int], device: torch.device, process_groups) -> tuple[object, list, str | None]:
    """Byte buffers from one memory pool allocated by NCCL (ncclMemAlloc) and registered as
    symmetric windows with every process group in `process_groups` (collective over each:
    every member must call this with the same sizes in the same order). Returns (pool,
    buffers, note): note says when registration fell back to plain (non-symmetric) windows."""
    first = process_groups[0]._get_backend(device)
    pool = torch.cuda.MemPool(first.mem_allocator)
    with torch.cuda.use_mem_pool(pool):
        buffers = [torch.empty(n, dtype=torch.uint8, device=device) for n in nbytes]
    note = None
    for pg in process_groups:
        backend = pg._get_backend(device)
        dist.all_reduce(torch.zeros(1, device=device), group=pg)  # NCCL's communicator must exist first
        try:
            backend.register_mem_pool(pool, symm=True)
        except TypeError:  # a torch without the symm flag: plain registration
            backend.register_mem_pool(pool)
            note = "registered without symm=True (this torch has no symmetric registration)"
    return pool, buffers, note


class SymmetricArena:
    """One registered buffer cut into slots of `slot_bytes`: the staging slots, then RING
    result slots per transition."""

    def __init__(self, slot_bytes: int, device: torch.device, process_groups):
        self.slot_bytes = slot_bytes
        self.names = list(STAGING) + [f"{op}/{i}" for op in RESULTS for i in range(RING)]
        self.pool, (self.flat,), self.note = register_buffers([slot_bytes * len(self.names)], device,
                                                              process_groups)

    def view(self, name: str, rows: int, like: torch.Tensor) -> torch.Tensor:
        """`rows` rows shaped and typed like `like`, at the start of slot `name`."""
        row_shape = tuple(like.shape[1:])
        nbytes = rows * math.prod(row_shape) * like.element_size()
        start = self.names.index(name) * self.slot_bytes
        return self.flat[start : start + nbytes].view(like.dtype).view((rows,) + row_shape)


class NcclSymmBackend(NcclBackend):
    name = "nccl_symm"

    def __init__(self, groups: dict[str, Group], device: torch.device):
        super().__init__(groups)
        self.device = device
        names = ("world", "attn_tp", "attn_dp")
        self.process_groups = list({id(g.pg): g.pg for g in (groups[n] for n in names) if g.pg is not None}.values())
        self.arenas: list[SymmetricArena] = []
        self.calls = dict.fromkeys(RESULTS, 0)
        self._arena_for(MIN_SLOT_BYTES)  # registration errors surface at construction

    @property
    def note(self) -> str | None:
        return self.arenas[-1].note if self.arenas else None

    def _arena_for(self, nbytes: int) -> SymmetricArena | None:
        """The arena with slots of at least `nbytes` (grown here if needed), or None when the
        transition is too large for windows (every rank decides the same: nbytes is shared)."""
        if nbytes > MAX_SLOT_BYTES:
            return None
        if self.arenas and self.arenas[-1].slot_bytes >= nbytes:
            return self.arenas[-1]
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise ValueError(f"the nccl_symm backend needs {nbytes} bytes of registered buffer inside CUDA graph "
                             f"capture but has {self.arenas[-1].slot_bytes}; run the step once before capturing it")
        slot = MIN_SLOT_BYTES
        while slot < nbytes:
            slot *= 2
        self.arenas.append(SymmetricArena(slot, self.device, self.process_groups))
        return self.arenas[-1]

    def _result_slot(self, op: str) -> str:
        slot = f"{op}/{self.calls[op] % RING}"
        self.calls[op] += 1
        return slot

    def _all_reduce_into(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """x's first rows (as many as `out`, a window) summed over the world, in place in `out`:
        a transition with one DP group (one_all_reduce)."""
        out.copy_(x[: out.shape[0]])
        dist.all_reduce(out, group=self.groups["world"].pg)
        return out

    @staticmethod
    def _stage(arena: SymmetricArena, x: torch.Tensor, rows: int) -> torch.Tensor:
        """x's first `rows` rows copied into the window (NCCL reads its inputs from there)."""
        staged = arena.view("input", rows, x)
        staged.copy_(x[:rows])
        return staged

    def gather_tokens(self, x, dp_sizes, partial: bool, fusion=None, algorithm=None, quant=None):
        counts = _host_counts(dp_sizes)
        total = sum(counts)
        arena = self._arena_for(total * math.prod(x.shape[1:]) * x.element_size())
        if arena is None or quant is not None:
            return super().gather_tokens(x, dp_sizes, partial, fusion, algorithm, quant)
        tp, dp = self.groups["attn_tp"], self.groups["attn_dp"]
        mine = counts[dp.index]
        out = arena.view(self._result_slot("gather_tokens"), total, x)
        gathered_rows = result_rows(dp_sizes, dp.index, x.shape[0], gathered=True)
        if fusion is None and partial and one_all_reduce(self.groups):  # as NcclBackend
            return pad_rows(self._all_reduce_into(out, x), gathered_rows)
        if fusion is None:
            chunk = arena.view("send", split_evenly(mine, tp.size)[tp.index], x)
            gather_tokens_two_step(self._stage(arena, x, mine), counts, self.groups, partial, chunk_out=chunk, out=out)
            return pad_rows(out, gathered_rows)
        # the engines' fused path, as NcclBackend: all-reduce(attn-TP), add + RMSNorm, all-gather(DP);
        # the norm writes the all-gather's input straight into the window
        reduced = x[:mine]
        if partial and tp.size > 1:
            reduced = self._stage(arena, x, mine)
            dist.all_reduce(reduced, group=tp.pg)
        send = arena.view("send", mine, x)
        _, residual_out = engine_add_rms_norm(reduced, fusion.residual[:mine], fusion.weight, fusion.eps, out=send)
        all_gather_rows(send, counts, dp, out=out)
        return pad_rows(out, gathered_rows), pad_rows(residual_out, result_rows(dp_sizes, dp.index, x.shape[0], False))

    def scatter_tokens(self, y, dp_sizes, algorithm=None):
        counts = _host_counts(dp_sizes)
        total = sum(counts)
        arena = self._arena_for(total * math.prod(y.shape[1:]) * y.element_size())
        if arena is None:
            return super().scatter_tokens(y, dp_sizes, algorithm)
        tp, dp = self.groups["attn_tp"], self.groups["attn_dp"]
        mine = counts[dp.index]
        out = arena.view(self._result_slot("scatter_tokens"), mine, y)
        if one_all_reduce(self.groups):  # as NcclBackend
            return pad_rows(self._all_reduce_into(out, y), result_rows(dp_sizes, dp.index, y.shape[0], gathered=False))
        staged = self._stage(arena, y, total)
        chunk_rows = split_evenly(mine, tp.size)[tp.index]
        chunk = out if tp.size == 1 else arena.view("send", chunk_rows, y)
        result = scatter_tokens_two_step(staged, counts, self.groups, chunk_out=chunk, out=out)
        return pad_rows(result, result_rows(dp_sizes, dp.index, y.shape[0], gathered=False))
