"""Process groups of a layout, created once per Communicator in the same order on every rank."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from .layout import GROUP_NAMES, Layout


@dataclass(frozen=True)
class Group:
    """One rank's view of one group: its members in group order and its own position."""

    name: str
    ranks: tuple[int, ...]
    index: int
    pg: object | None  # torch ProcessGroup; None for a group of one

    @property
    def size(self) -> int:
        return len(self.ranks)


def create_groups(layout: Layout, rank: int) -> dict[str, Group]:
    """Every rank must call this in the same order: `new_group` is collective over the world,
    also for groups the caller is not in. Groups with the same members share one process group."""
    world = tuple(range(layout.world_size))
    made: dict[tuple[int, ...], object] = {world: dist.group.WORLD}
    for name in GROUP_NAMES:
        for ranks in layout.groups(name):
            if len(ranks) > 1 and ranks not in made:
                made[ranks] = dist.new_group(list(ranks))
    groups = {}
    for name in GROUP_NAMES:
        ranks = layout.group_ranks(name, rank)
        groups[name] = Group(name, ranks, ranks.index(rank), made.get(ranks) if len(ranks) > 1 else None)
    return groups
