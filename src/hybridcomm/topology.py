"""Groups that span nodes: their node parts, rails, and the reduction order across nodes.

A group's members are in increasing rank order and a node is a contiguous block of ranks,
so the members on one node are contiguous in group order. For a group that spans N nodes
with L members on each (every group of a layout has the same L on every node it touches
when the sizes divide; otherwise it has no rails and stays on the flat path):

    node part of node n:  the L members on node n, in group order   -> legs over NVLink
    rail j:               the j-th member of every node part, in node order -> legs over the network

so member (n, j) is group position n * L + j. Internal process groups get the names
`<group>/node` and `<group>/rail` (never part of the public contract).

Reduction order (the semantics of every backend for a group that spans nodes): each node's
members are summed in fp32 in group order and rounded to the input dtype once per node
(what crosses the network is in the input dtype), then the node partials are summed in fp32
in node order and rounded once. A group on one node keeps the flat order: fp32 over all
members in group order, rounded once. `sum_by_node` is that definition.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .layout import Layout


@dataclass(frozen=True)
class Split:
    """How one group lies over nodes."""

    ranks: tuple[int, ...]
    nodes: tuple[int, ...]  # node of each member, in group order

    @property
    def num_nodes(self) -> int:
        return len(set(self.nodes))

    @property
    def per_node(self) -> int | None:
        """Members per node part if every node part has the same size, else None."""
        counts = {self.nodes.count(n) for n in set(self.nodes)}
        return counts.pop() if len(counts) == 1 else None

    def node_part(self, rank: int) -> tuple[int, ...]:
        node = self.nodes[self.ranks.index(rank)]
        return tuple(r for r, n in zip(self.ranks, self.nodes) if n == node)

    def rail(self, rank: int) -> tuple[int, ...]:
        j = self.node_part(rank).index(rank)
        return tuple(r for r in self.ranks if self.node_part(r).index(r) == j)


def split(layout: Layout, ranks: tuple[int, ...]) -> Split:
    return Split(tuple(ranks), tuple(layout.coords(r).node for r in ranks))


def has_rails(layout: Layout, ranks: tuple[int, ...]) -> bool:
    """True if the group spans nodes with the same number of members on each."""
    s = split(layout, ranks)
    return s.num_nodes > 1 and s.per_node is not None


def sum_in_order(parts: list[torch.Tensor]) -> torch.Tensor:
    """fp32 sum in list order: ((p0 + p1) + p2) + ... One part is returned as it is (in its
    own dtype): a sum over one member is that member's values bit for bit, as our kernels and
    NCCL copy them (an fp32 round trip would turn every NaN into the canonical one)."""
    if len(parts) == 1:
        return parts[0].clone()
    acc = parts[0].float().clone()
    for p in parts[1:]:
        acc += p.float()
    return acc


def sum_by_node(parts: list[torch.Tensor], nodes: tuple[int, ...] | None, dtype: torch.dtype) -> torch.Tensor:
    """The group sum in fp32 (the caller rounds once): parts in group order, nodes[i] the node of
    part i (None or one node: the flat fp32 order). Across nodes each node's partial is rounded
    to `dtype` before the fp32 sum over nodes, in node order."""
    if nodes is None or len(set(nodes)) == 1:
        return sum_in_order(parts)
    order = list(dict.fromkeys(nodes))
    partials = [sum_in_order([p for p, n in zip(parts, nodes) if n == node]).to(dtype) for node in order]
    return sum_in_order(partials)
