"""The reference backend: every op composed from torch.distributed all_gather.

This is the semantic truth that every fast path is compared with. It moves raw bytes
(so any dtype travels bit-exactly over gloo or NCCL) and reduces locally in fp32, in
group order, then rounds once. Every backend reduces in this order, so a kernel that
does the same produces the same bits, and all ranks holding a value hold the same bits.
Communicated inputs are seen through reserved.fix_reserved, as in our kernels.
It favours obviousness over speed: reductions gather every contribution to every rank.
For a group that spans nodes the order is per node, then over nodes (topology.sum_by_node).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..agreement import OK, Signature, decode, describe_call, encode, rejected, status_of, verdict
from ..arguments import Sizes, result_rows
from ..errors import CapacityExceeded
from ..groups import Group
from ..norm import add_rms_norm
from ..quant.reference import quantized_move
from ..reserved import fix_reserved
from ..topology import sum_by_node


# Data that travels in the same all-gather as the header (a fixed size, so the byte counts
# match whatever the ranks passed): small calls cost one exchange, not two.
HEADED_PAYLOAD_BYTES = 16 << 10


def padded_bytes(x: torch.Tensor, counts: list[int], index: int) -> torch.Tensor:
    """This member's counts[index] rows padded to max(counts) rows, as raw bytes."""
    padded = x.new_zeros((max(counts),) + tuple(x.shape[1:]))
    mine = x[: counts[index]]  # fewer rows than counts[index]: capacity exceeded, the headers say so
    padded[: mine.shape[0]] = mine
    return padded.view(-1).view(torch.uint8)


def unpack(received: list[torch.Tensor], like: torch.Tensor, counts: list[int]) -> list[torch.Tensor]:
    shape = (max(counts),) + tuple(like.shape[1:])
    return [r.view(like.dtype).view(shape)[:c] for r, c in zip(received, counts)]


def gather_rows(x: torch.Tensor, counts: list[int], group: Group) -> list[torch.Tensor]:
    """Member i contributes its first counts[i] rows; returns every member's rows."""
    if group.size == 1:
        return [x[: counts[0]]]
    raw = padded_bytes(x, counts, group.index)
    received = [torch.empty_like(raw) for _ in counts]
    if raw.numel():
        dist.all_gather(received, raw, group=group.pg)
    return unpack(received, x, counts)


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


class Call:
    """One op's sequence of exchanges, each headed by the call's signature.

    Before any data moves over a group, its members all-gather their signatures
    (hybridcomm.agreement): differing dtypes, trailing shapes, rows or sizes would make
    gloo abort on mismatched byte counts or return garbage; instead every rank raises the
    same exception. A rank that fails passes its failure on through the op's remaining
    exchanges, so ranks of other groups that are waiting there raise too instead of hanging.
    """

    def __init__(self, sig: Signature, groups: list[Group], device: torch.device, max_sizes: int,
                 headers: bool = True):
        self.sig, self.device, self.max_sizes = sig, device, max_sizes
        self.pending = [g for g in groups if g.size > 1]
        # Without headers (validate=True agreed already; graph capture cannot read them back)
        # the exchanges go straight to the data.
        self.headers = headers and not (device.type == "cuda" and torch.cuda.is_current_stream_capturing())

    def agree(self, group: Group) -> None:
        """Headers only (an exchange that moves no data)."""
        if group.size == 1:
            return
        self._next(group)
        if self.headers:
            self._judge(self._verdict(group, self._exchange(group, OK, 0)[0]))

    def gather(self, x: torch.Tensor, counts: list[int], group: Group) -> list[torch.Tensor]:
        """Every member's first counts[i] rows, after the headers agreed. The header and up to
        HEADED_PAYLOAD_BYTES of data share one all-gather; the rest (an agreed size) follows."""
        if group.size == 1 or not self.headers:
            self.agree(group)
            return gather_rows(x, counts, group)
        self._next(group)
        raw = padded_bytes(x, counts, group.index)
        headers, inlines = self._exchange(group, OK, 0, raw)
        self._judge(self._verdict(group, headers))
        inline = min(raw.numel(), HEADED_PAYLOAD_BYTES)
        rest = raw[inline:]  # the same size on every member, now that the headers agree
        rests = [torch.empty_like(rest) for _ in range(group.size)]
        if rest.numel():
            dist.all_gather(rests, rest, group=group.pg)
        return unpack([torch.cat([i[:inline], r]) for i, r in zip(inlines, rests)], x, counts)

    def _next(self, group: Group) -> None:
        if not self.pending or self.pending[0].name != group.name:
            raise AssertionError(f"reference backend: exchange over {group.name!r} is not in the op's "
                                 f"declared sequence {[g.name for g in self.pending]}")
        self.pending.pop(0)

    def _judge(self, found) -> None:
        """Raise what the exchange found, after passing it on to the op's later exchanges."""
        if found is not None:
            status, origin, error = found
            self.abandon(status, origin)
            raise error

    def abandon(self, status: int, origin: int) -> None:
        """Tell the remaining exchanges' members that this call failed (status, origin)."""
        while self.pending:
            self._exchange(self.pending.pop(0), status, origin)

    def _exchange(self, group: Group, status: int, origin: int, raw: torch.Tensor | None = None):
        """One all-gather of a fixed-size slab: the header, then the first HEADED_PAYLOAD_BYTES
        of `raw` (zeros without). Every exchange has this shape, so a member that fails and one
        that sends data still match. Returns (headers, each member's inline bytes)."""
        head = torch.tensor(encode(self.sig, self.max_sizes, status, origin), dtype=torch.int64)
        head = head.view(torch.uint8)
        h = head.numel()
        slab = torch.zeros(h + HEADED_PAYLOAD_BYTES, dtype=torch.uint8, device=self.device)
        slab[:h] = head
        if raw is not None:
            inline = min(raw.numel(), HEADED_PAYLOAD_BYTES)
            slab[h : h + inline] = raw[:inline]
        slabs = [torch.empty_like(slab) for _ in range(group.size)]
        dist.all_gather(slabs, slab, group=group.pg)
        headers = torch.stack([s[:h] for s in slabs]).cpu().view(torch.int64).tolist()
        return headers, [s[h:] for s in slabs]

    def _verdict(self, group: Group, rows: list[list[int]]):
        decoded = [decode(r, self.max_sizes) for r in rows]
        return verdict(decoded, list(group.ranks), {r: group.ranks for r in group.ranks})


def capacity_sizes(sizes: Sizes, x: torch.Tensor, groups: list[Group]) -> Sizes:
    """Under graph capture, device-side sizes of a call whose exchange groups all have one
    member, as host sizes of the capacity (x's rows). Nothing travels there, so no count is
    needed, and reading one would synchronise, which a capture forbids. The rows past the real
    count are computed like the others: the contract leaves them unspecified. A count above the
    capacity goes unseen there (nothing reads it); eager calls still read the counts and raise."""
    capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()
    if capturing and sizes.on_device and all(g.size == 1 for g in groups):
        return Sizes(sizes.count, host=(x.shape[0],) * sizes.count)
    return sizes


def gather_owned(rows: torch.Tensor, counts: list[int], group: Group, capacity: int, call: Call, quant=None):
    """Every member's own rows, concatenated and padded to `capacity`; with `quant`, each
    member quantizes its rows first and the quantized bytes travel (QuantizedRows). The
    first exchange carries the call's header (Call.gather); a quantized call's second one
    (the scales) follows the agreed header directly."""
    headed = False

    def gather(t):
        nonlocal headed
        exchange = gather_rows if headed else call.gather
        headed = True
        return pad_rows(torch.cat(exchange(t, counts, group)), capacity)

    return quantized_move(rows, quant, gather)


class ReferenceBackend:
    name = "reference"

    def __init__(self, groups: dict[str, Group], device: torch.device | None = None, headers: bool = True):
        self.groups, self.headers = groups, headers
        self.device = torch.device("cpu") if device is None else device
        self.me = groups["world"].index

    def exchange_groups(self, op: str, group: Group) -> list[Group]:
        """The groups an op exchanges over, in order (the same for every call of the op)."""
        g = self.groups
        return {"gather_tokens": [g["attn_tp"], g["attn_dp"]], "scatter_tokens": [g["world"]]}.get(op, [group])

    def reject(self, op: str, group: Group, error: Exception) -> None:
        """This rank's local checks failed: take part in the op's exchanges with a failure
        status (so its peers raise instead of waiting), then let the caller raise `error`."""
        self._call(rejected(op), group).abandon(status_of(error), self.me)

    def _call(self, sig: Signature, group: Group) -> Call:
        return Call(sig, self.exchange_groups(sig.op_name, group), self.device, self.groups["world"].size,
                    self.headers)

    def all_reduce(self, x: torch.Tensor, group: Group, algorithm=None) -> torch.Tensor:
        x = fix_reserved(x)
        call = self._call(describe_call("all_reduce", group.name, x), group)
        parts = call.gather(x, [x.shape[0]] * group.size, group)
        return sum_by_node(parts, group.nodes, x.dtype).to(x.dtype)

    def all_gather_v(self, x: torch.Tensor, sizes: Sizes, group: Group, algorithm=None, quant=None):
        x = fix_reserved(x)
        sizes = capacity_sizes(sizes, x, [group])
        sig = describe_call("all_gather_v", group.name, x, sizes)
        counts = list(sig.sizes)
        return gather_owned(x[: counts[group.index]], counts, group,
                            result_rows(sizes, group.index, x.shape[0], gathered=True), self._call(sig, group), quant)

    def reduce_scatter_v(self, x: torch.Tensor, sizes: Sizes, group: Group, algorithm=None) -> torch.Tensor:
        sizes = capacity_sizes(sizes, x, [group])
        sig = describe_call("reduce_scatter_v", group.name, x, sizes)
        return _sum_my_rows(fix_reserved(x), sig, sizes, group.index, group, self._call(sig, group))

    def gather_tokens(self, x, dp_sizes: Sizes, partial: bool, fusion=None, algorithm=None, quant=None):
        x = fix_reserved(x)
        tp, dp, world = self.groups["attn_tp"], self.groups["attn_dp"], self.groups["world"]
        dp_sizes = capacity_sizes(dp_sizes, x, [world])
        sig = describe_call("gather_tokens", world.name, x, dp_sizes, partial, fusion)
        call = self._call(sig, world)
        counts = list(sig.sizes)
        mine = x[: counts[dp.index]]
        call.agree(tp)  # also when not partial: every rank must make the same exchanges
        parts = gather_rows(mine, [mine.shape[0]] * tp.size, tp) if partial else None
        reduced = sum_by_node(parts, tp.nodes, x.dtype) if partial else mine
        residual_out = None
        if fusion is None:
            send = reduced.to(x.dtype)
        else:
            send, residual_out = add_rms_norm(reduced, fusion.residual[: mine.shape[0]],
                                              fusion.weight, fusion.eps)
        out = gather_owned(send, counts, dp, result_rows(dp_sizes, dp.index, x.shape[0], gathered=True), call, quant)
        if fusion is None:
            return out
        return out, pad_rows(residual_out, result_rows(dp_sizes, dp.index, x.shape[0], gathered=False))

    def scatter_tokens(self, y: torch.Tensor, dp_sizes: Sizes, algorithm=None) -> torch.Tensor:
        world = self.groups["world"]
        dp_sizes = capacity_sizes(dp_sizes, y, [world])
        sig = describe_call("scatter_tokens", world.name, y, dp_sizes)
        # Rows of every DP group summed over the whole world: my DP group's slice of them.
        return _sum_my_rows(fix_reserved(y), sig, dp_sizes, self.groups["attn_dp"].index, world, self._call(sig, world))


def _sum_my_rows(x: torch.Tensor, sig: Signature, sizes: Sizes, index: int, over: Group, call: Call) -> torch.Tensor:
    """Rows [sum(sizes[:index]), +sizes[index]) of x, summed over the members of `over`."""
    counts = list(sig.sizes)
    total, start = sum(counts), sum(counts[:index])
    parts = call.gather(x[:total], [total] * over.size, over)
    mine = sum_by_node([p[start : start + counts[index]] for p in parts], over.nodes, x.dtype).to(x.dtype)
    return pad_rows(mine, result_rows(sizes, index, x.shape[0], gathered=False))
