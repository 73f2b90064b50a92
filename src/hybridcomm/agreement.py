"""What must agree across ranks for one call, and how a disagreement is reported.

A call's *signature* (op, group, dtype, trailing shape, rows, sizes, partial, fused-norm
arguments) is packed into one fixed-width int64 row. Ranks all-gather their rows once and
every rank runs the same deterministic comparison on the same rows, so every rank raises
the same exception, naming the argument and the two ranks that differ.

Used twice: `Communicator(validate=True)` exchanges the row over the world before any op,
and the reference backend heads each of its exchanges with it (so a mismatch becomes an
exception there instead of gloo aborting on differing byte counts).

A row also carries a *status*: a rank whose local checks failed, that saw the capacity
exceeded, or that saw a mismatch in an earlier exchange of the same op still takes part
in the exchange with a non-zero status, and every rank that receives it raises too.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .arguments import SUPPORTED_DTYPES, Sizes
from .errors import ArgumentMismatch, CapacityExceeded
from .layout import GROUP_NAMES
from .ops import OPS, op_name

GATHERS = ("all_gather_v", "gather_tokens")        # sizes[i] rows come from member i
MAX_ROW_DIMS = 8                                   # trailing dims stored verbatim (more: hashed)
NOT_COMPARED = -1                                  # a field that does not apply to this call

# Status of a row: why a rank cannot go on (0: it can).
OK, REJECTED, CAPACITY, MISMATCH = range(4)


def _eps_bits(eps: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(eps)))[0]


def _bits_eps(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<q", bits))[0]


def _row_dims(shape: tuple[int, ...]) -> tuple[int, ...]:
    dims = tuple(shape[1:])
    if len(dims) > MAX_ROW_DIMS:  # fold the tail into one number: compared, shown approximately
        dims = dims[: MAX_ROW_DIMS - 1] + (hash(dims[MAX_ROW_DIMS - 1:]) & (2**62 - 1),)
    return dims


@dataclass(frozen=True)
class Signature:
    """One rank's view of one call: everything that must agree across the group."""

    op: int
    group: int = NOT_COMPARED
    dtype: int = NOT_COMPARED
    row_shape: tuple[int, ...] = ()
    rows: int = NOT_COMPARED
    sizes_on_device: int = NOT_COMPARED
    sizes: tuple[int, ...] = ()
    partial: int = NOT_COMPARED
    fused: int = NOT_COMPARED
    eps: int = NOT_COMPARED  # float64 bits

    @property
    def op_name(self) -> str:
        return op_name(self.op)

    @property
    def sizes_name(self) -> str:
        return "dp_sizes" if self.op_name in ("gather_tokens", "scatter_tokens") else "sizes"


def describe_call(op: str, group: str, x: torch.Tensor, sizes: Sizes | None = None,
                  partial: bool | None = None, fusion=None) -> Signature:
    """The signature of a call whose local checks passed (device sizes are read here)."""
    on_device = NOT_COMPARED if sizes is None else int(sizes.on_device)
    values = () if sizes is None else tuple(sizes.values())
    # Rows must agree where they are not one member's own count: a result of equal rows
    # (all_reduce), a scatter's input (sum of sizes), or a capacity (device-side sizes).
    compare_rows = op not in GATHERS or on_device == 1
    return Signature(
        op=int(OPS[op].code), group=GROUP_NAMES.index(group.split("/")[0]),  # internal legs: their group's
        dtype=SUPPORTED_DTYPES.index(x.dtype),
        row_shape=_row_dims(tuple(x.shape)), rows=x.shape[0] if compare_rows else NOT_COMPARED,
        sizes_on_device=on_device, sizes=values,
        partial=NOT_COMPARED if partial is None else int(bool(partial)),
        fused=NOT_COMPARED if op != "gather_tokens" else int(fusion is not None),
        eps=_eps_bits(fusion.eps) if fusion is not None else NOT_COMPARED)


# -- the row --------------------------------------------------------------------------------
# Signature fields in row (and comparison) order; a tuple is stored as its length, then its
# values padded with NOT_COMPARED to a fixed width (MAX_ROW_DIMS, or the world size for sizes).
FIELDS = ("op", "group", "dtype", "row_shape", "rows", "sizes_on_device", "sizes", "partial", "fused", "eps")


def encode(sig: Signature, max_sizes: int, status: int = OK, origin: int = 0) -> list[int]:
    row = [status, origin]
    for name in FIELDS:
        value = getattr(sig, name)
        if isinstance(value, tuple):
            width = MAX_ROW_DIMS if name == "row_shape" else max_sizes
            row += [len(value)] + list(value) + [NOT_COMPARED] * (width - len(value))
        else:
            row.append(value)
    return row


def decode(row: list[int], max_sizes: int) -> tuple[int, int, Signature]:
    """(status, origin rank, signature)."""
    values, i = {}, 2
    for name in FIELDS:
        if name in ("row_shape", "sizes"):
            width = MAX_ROW_DIMS if name == "row_shape" else max_sizes
            n = row[i]
            values[name] = tuple(row[i + 1 : i + 1 + n])
            i += 1 + width
        else:
            values[name] = row[i]
            i += 1
    return row[0], row[1], Signature(**values)


def exchange(row: list[int], pg, size: int, device: torch.device) -> list[list[int]]:
    """All-gather one int64 row per member (group order)."""
    mine = torch.tensor(row, dtype=torch.int64, device=device)
    rows = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(rows, mine, group=pg)
    return torch.stack(rows).tolist()


# -- comparing ------------------------------------------------------------------------------
def _show(sig: Signature, field: str) -> str:
    value = getattr(sig, field)
    shown = {
        "op": op_name,
        "group": lambda v: repr(GROUP_NAMES[v]),
        "dtype": lambda v: str(SUPPORTED_DTYPES[v]),
        "row_shape": lambda v: str(v),
        "sizes_on_device": lambda v: "an int32 tensor" if v else "a list of ints",
        "sizes": lambda v: str(list(v)),
        "partial": lambda v: str(bool(v)),
        "fused": lambda v: "residual and norm_weight" if v else "no residual/norm_weight",
        "eps": lambda v: f"{_bits_eps(v):g}",
    }.get(field, str)
    return "nothing" if value == NOT_COMPARED else shown(value)


def _label(sig: Signature, field: str) -> str:
    return {"row_shape": "trailing shape (x.shape[1:])", "rows": "rows of the input",
            "sizes_on_device": f"the kind of {sig.sizes_name}", "sizes": sig.sizes_name,
            "fused": "the residual+norm fusion"}.get(field, field)


def disagreement(sigs: dict[int, Signature], members: dict[int, tuple[int, ...]]) -> str | None:
    """The first difference between a rank and the first member of its group, or None.

    `sigs`: world rank -> signature; `members`: world rank -> the ranks of its group.
    Ranks are visited in order, fields in FIELDS order: every rank finds the same one."""
    for rank in sorted(sigs):
        first = members[rank][0]
        ref, mine = sigs[first], sigs[rank]
        for field in FIELDS:
            if getattr(ref, field) != getattr(mine, field):
                return (f"{ref.op_name}: ranks disagree on {_label(ref, field)}: rank {first} passed "
                        f"{_show(ref, field)}, rank {rank} passed {_show(mine, field)}")
    return None


def capacity_problem(sig: Signature) -> str | None:
    """Device-side counts beyond the rows the (agreed) inputs hold, or None."""
    if sig.sizes_on_device != 1:
        return None
    name = sig.sizes_name
    if sig.op_name in GATHERS:
        for i, v in enumerate(sig.sizes):
            if v > sig.rows:
                return (f"{sig.op_name}: {name}[{i}] = {v} rows (read on the device), but the inputs "
                        f"hold only {sig.rows} rows (the capacity)")
    elif sum(sig.sizes) > sig.rows:
        return (f"{sig.op_name}: {name} (read on the device) sum to {sum(sig.sizes)} rows, but the "
                f"input holds only {sig.rows}")
    return None


def verdict(rows: list[tuple[int, int, Signature]], ranks: list[int],
            members: dict[int, tuple[int, ...]]) -> tuple[int, int, Exception] | None:
    """(status, origin, exception) that every rank of the exchange raises, or None to go on.

    `rows`: decoded rows in the order of `ranks`. The same on every rank that got them."""
    for rank, (status, origin, sig) in zip(ranks, rows):
        if status != OK:
            return status, origin, _relayed(status, origin, sig)
    sigs = {rank: sig for rank, (_, _, sig) in zip(ranks, rows)}
    message = disagreement(sigs, members)
    if message:
        return MISMATCH, ranks[0], ArgumentMismatch(message)
    for rank, (_, _, sig) in zip(ranks, rows):
        message = capacity_problem(sig)
        if message:
            return CAPACITY, rank, CapacityExceeded(message + "; no rank returned a result")
    return None


def _relayed(status: int, origin: int, sig: Signature) -> Exception:
    op = sig.op_name
    if status == REJECTED:
        return ArgumentMismatch(f"{op}: rank {origin} rejected its arguments (its own error says why); "
                                f"no rank returned a result")
    if status == CAPACITY:
        return CapacityExceeded(f"{op}: device-side sizes exceed the capacity (rank {origin} saw it and "
                                f"says by how much); no rank returned a result")
    return ArgumentMismatch(f"{op}: the arguments differ across ranks (rank {origin} found the difference; its "
                            f"error names the argument); no rank returned a result")


def status_of(error: Exception) -> int:
    return CAPACITY if isinstance(error, CapacityExceeded) else REJECTED


def rejected(op: str) -> Signature:
    """The row of a rank whose local checks failed: only the op is known."""
    return Signature(op=int(OPS[op].code))

