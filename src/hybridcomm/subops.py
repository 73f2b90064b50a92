"""One op run as a step of another (a hierarchical leg, a step of a composed transition):
through the Communicator's selection, so each step picks its own backend and algorithm by the
table, but not through its argument checks and agreement: those ran once for the whole call,
and the steps are consistent by construction.
"""

from __future__ import annotations

import torch

from .arguments import Sizes, parse_sizes
from .counts import exchange_into


def run(comm, op: str, group: str, x: torch.Tensor, sizes=None) -> torch.Tensor:
    """`op` on a (public or internal) group. sizes: Sizes, a list, or a device tensor; or a
    gather's own-count Sizes (counts.py), whose `device` tensor ends up holding every member's
    count: filled by the kernel where the chosen one exchanges counts, else exchanged first.
    comm.last_choice stays the enclosing call's (benchmarks and tests read it after the call)."""
    g = comm.groups[group]
    if sizes is not None and not isinstance(sizes, Sizes):
        sizes = parse_sizes(sizes, g.size, x.device, "sizes")
    enclosing = comm.last_choice
    backend, algorithm = comm._select(op, g, x, sizes, g.index)
    comm.last_choice = enclosing
    if sizes is not None and sizes.own is not None and not comm._exchanges_counts(op, backend, algorithm):
        sizes = Sizes(sizes.count, device=exchange_into(sizes.own, sizes.device, g))
    if op == "all_reduce":
        return backend.all_reduce(x, g, algorithm)
    return getattr(backend, op)(x, sizes, g, algorithm)
