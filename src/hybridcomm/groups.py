"""Process groups of a layout, created once per Communicator in the same order on every rank."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from .layout import GROUP_NAMES, Layout
from .topology import Split, has_rails, split

# Internal groups of a group that spans nodes (topology.py): its members on this rank's node
# and this rank's rail. Not part of the public group names.
LEGS = {"node": Split.node_part, "rail": Split.rail}


@dataclass(frozen=True)
class Group:
    """One rank's view of one group: its members in group order and its own position."""

    name: str
    ranks: tuple[int, ...]
    index: int
    pg: object | None  # torch ProcessGroup; None for a group of one
    nodes: tuple[int, ...] | None = None  # node of each member; None: one node

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def spans_nodes(self) -> bool:
        return self.nodes is not None and len(set(self.nodes)) > 1


def leg_name(name: str, leg: str) -> str:
    return f"{name}/{leg}"


def _member_sets(layout: Layout, name: str) -> dict[str, list[tuple[int, ...]]]:
    """The group's own member sets and, where it has rails, every node part and rail."""
    sets = {name: layout.groups(name)}
    if has_rails(layout, layout.group_ranks(name, 0)):
        for leg, members_of in LEGS.items():
            parts = {members_of(split(layout, g), r) for g in layout.groups(name) for r in g}
            sets[leg_name(name, leg)] = sorted(parts)
    return sets


def member_sets(layout: Layout) -> dict[str, list[tuple[int, ...]]]:
    """Every group name (public, then its internal legs) -> all its member sets; the same
    order on every rank."""
    return {k: v for name in GROUP_NAMES for k, v in _member_sets(layout, name).items()}


def _owner(sets: list[tuple[int, ...]], rank: int) -> tuple[int, ...]:
    return next(s for s in sets if rank in s)


def create_groups(layout: Layout, rank: int, timeout_s: float | None = None) -> dict[str, Group]:
    """Every rank must call this in the same order: `new_group` is collective over the world,
    also for groups the caller is not in. Groups with the same members share one process group.
    Internal groups (node parts and rails of groups that span nodes) get `timeout_s` as their
    deadline, so a peer that never arrives fails the call instead of hanging it."""
    world = tuple(range(layout.world_size))
    # Public and internal groups never share a process group: only internal ones carry the deadline.
    made: dict[tuple[bool, tuple[int, ...]], object] = {(False, world): dist.group.WORLD}
    timeout = {} if timeout_s is None else {"timeout": timedelta(seconds=timeout_s)}
    sets = member_sets(layout)
    for key, members in sets.items():
        internal = "/" in key
        for ranks in members:
            if len(ranks) > 1 and (internal, ranks) not in made:
                made[internal, ranks] = dist.new_group(list(ranks), **(timeout if internal else {}))
    groups = {}
    for key, members in sets.items():
        ranks = _owner(members, rank)
        nodes = tuple(layout.coords(r).node for r in ranks) if layout.num_nodes > 1 else None
        groups[key] = Group(key, ranks, ranks.index(rank), made.get(("/" in key, ranks)), nodes)
    return groups
