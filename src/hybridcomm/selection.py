"""A memo of the selection decision (which backend and algorithm run a call), per call signature.

The decision (Communicator._decide: the table's rule and, for our kernels, whether they can run
the call) is a function of the call's signature alone, given the communicator's fixed state
(device, forced backend, tables, workspace):

- op, group, dtype and the shape of x (message bytes, row bytes, quantized row width);
- the sizes: none, on the device (the result's capacity then counts), or on the host, where
  only their sum (the gathered message) and their largest value (the rows one peer receives)
  enter the decision;
- the quantized format (its row bytes).

An eager decode step repeats the same few signatures in every layer, so the table lookup and
the nvlink backend's checks run once per signature instead of on every call (they were ~5-8 µs
of a 17-45 µs host path: results/cpu/host_cost_cpu.md). tests/test_selection.py checks that the
memo's answer equals the decision made afresh over many signatures.

Invalidation: the memo is dropped when the communicator's tables are replaced (compared by
identity: tables are never changed in place; pass a new one) and on close(). Bounded: decode
steps with changing counts keep making signatures; past LIMIT entries it starts over.
"""

from __future__ import annotations

import torch

from .algorithms import Choice
from .arguments import Sizes

LIMIT = 4096
DEVICE_SIZES = "device"


def signature(op: str, group_name: str, x: torch.Tensor, sizes: Sizes | None, quant) -> tuple:
    """The part of a call the decision depends on (module docstring)."""
    if sizes is None:
        counts = None
    elif sizes.host is None:
        counts = DEVICE_SIZES
    else:
        counts = (sum(sizes.host), max(sizes.host))
    return op, group_name, x.dtype, x.shape, counts, None if quant is None else quant.format.code


class SelectionMemo:
    """signature -> Choice, valid for one single-node table and one node-count -> table map."""

    def __init__(self):
        self.choices: dict[tuple, Choice] = {}
        self.table = self.tables = None

    def get(self, key: tuple, table, tables) -> Choice | None:
        if table is not self.table or tables is not self.tables:
            self.clear()
            self.table, self.tables = table, tables
        return self.choices.get(key)

    def put(self, key: tuple, choice: Choice) -> Choice:
        if len(self.choices) >= LIMIT:
            self.choices.clear()
        self.choices[key] = choice
        return choice

    def clear(self) -> None:
        self.choices.clear()
