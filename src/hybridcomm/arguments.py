"""Local checks of the arguments of every op, done before any communication.

Every message names the argument, what was expected and what was received.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Sequence

import torch

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


_SUPPORTED = frozenset(SUPPORTED_DTYPES)  # a hash lookup: `in` on the tuple compares one by one


def check_tensor(x: object, arg: str, device: torch.device) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{arg}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _SUPPORTED:
        raise TypeError(
            f"{arg}: unsupported dtype {x.dtype}; supported are float32, float16, bfloat16"
        )
    if x.dim() < 1:
        raise ValueError(f"{arg}: expected at least one dimension (rows first), got a 0-d tensor")
    # Equal devices first: one C comparison, where same_device's attribute reads cost µs per call.
    if x.device != device and not same_device(x.device, device):
        raise ValueError(f"{arg}: expected a tensor on {device}, got one on {x.device}")
    if not x.is_contiguous():
        raise ValueError(f"{arg}: expected a contiguous tensor, got strides {tuple(x.stride())} "
                         f"for shape {tuple(x.shape)} (call .contiguous())")
    return x


def same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    return a.type == "cpu" or (a.index or 0) == (b.index or 0)


def check_rows(x: torch.Tensor, arg: str, expected: int, what: str, *what_args) -> None:
    """`what` is formatted with `what_args` only when the check fails (calls pay no formatting)."""
    if x.shape[0] != expected:
        what = what.format(*what_args)
        raise ValueError(f"{arg}: expected {expected} rows ({what}), got {x.shape[0]} "
                         f"(shape {tuple(x.shape)})")


@dataclass(frozen=True)
class Sizes:
    """Row counts per group member: known on the host, or an int32 tensor read by the kernel;
    or (own-count mode, counts.py) this rank's count alone in `own`, exchanged by the kernel,
    which writes every member's count into `device`."""

    count: int
    host: tuple[int, ...] | None = None
    device: torch.Tensor | None = None
    own: torch.Tensor | None = None

    @property
    def on_device(self) -> bool:
        return self.device is not None

    def values(self) -> tuple[int, ...]:
        """Host values; reads (and synchronises on) a device tensor."""
        if self.host is not None:
            return self.host
        return tuple(int(v) for v in self.device.tolist())


def parse_sizes(sizes: object, count: int, device: torch.device, arg: str) -> Sizes:
    if isinstance(sizes, Sizes):  # already parsed (a Counts the kernel will exchange, counts.py)
        return sizes
    if isinstance(sizes, torch.Tensor):
        if sizes.dtype != torch.int32:
            raise TypeError(f"{arg}: a sizes tensor must be int32, got {sizes.dtype}")
        if sizes.dim() != 1 or sizes.numel() != count:
            raise ValueError(f"{arg}: expected {count} sizes (one per group member), "
                             f"got a tensor of shape {tuple(sizes.shape)}")
        if sizes.device != device and not same_device(sizes.device, device):
            raise ValueError(f"{arg}: a sizes tensor must be on {device}, got one on {sizes.device}")
        if not sizes.is_contiguous():
            raise ValueError(f"{arg}: a sizes tensor must be contiguous")
        return Sizes(count, device=sizes)
    if type(sizes) in (list, tuple) and len(sizes) == count and all(type(v) is int and v >= 0 for v in sizes):
        return Sizes(count, host=tuple(sizes))  # the common case, without per-element messages
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence):
        raise TypeError(f"{arg}: expected a sequence of ints or an int32 tensor, "
                        f"got {type(sizes).__name__}")
    values = tuple(_as_count(v, f"{arg}[{i}]") for i, v in enumerate(sizes))
    if len(values) != count:
        raise ValueError(f"{arg}: expected {count} sizes (one per group member), got {len(values)}: "
                         f"{list(values)}")
    return Sizes(count, host=values)


def _as_count(v: object, arg: str) -> int:
    try:
        n = operator.index(v)  # ints, numpy ints; not floats
    except TypeError:
        n = None
    if n is None or isinstance(v, bool) or n < 0:
        raise ValueError(f"{arg}: expected a non-negative int, got {v!r}")
    return n


def result_rows(sizes: Sizes, index: int, input_rows: int, gathered: bool) -> int:
    """Rows of an op's result.

    Host sizes: the exact count (sum of sizes for a gather, own size for a scatter).
    Device sizes: the host cannot know the counts, so the result has capacity rows --
    `len(sizes) * input_rows` for a gather, `input_rows` for a scatter -- of which the
    leading sum(sizes) / sizes[index] rows hold the result and the rest is unspecified.
    """
    if sizes.host is not None:
        return sum(sizes.host) if gathered else sizes.host[index]
    return sizes.count * input_rows if gathered else input_rows


def split_evenly(rows: int, parts: int) -> list[int]:
    """Rows per part when `rows` are cut into `parts` contiguous chunks (earlier chunks smaller).

    The token transitions cut a DP group's rows this way among its attn-TP ranks; the
    kernels compute the same cut on the device.
    """
    return [rows * (p + 1) // parts - rows * p // parts for p in range(parts)]
