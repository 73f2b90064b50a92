"""Groups across (simulated) nodes on gloo workers: every op x group x layout with
ranks_per_node set, through the hierarchical algorithms (backend "auto") and the reference,
against the oracle bit for bit (the order across nodes is topology.sum_by_node's); a peer of
the second node that skips a call; the internal node and rail groups."""

import pytest

from hybridcomm import Layout
from hybridcomm.check import cases_for_layout
from test_ops import run_checked


def layouts(world: int, ranks_per_node: int) -> list[Layout]:
    return [Layout(world, lay.attn_tp, lay.moe_tp, ranks_per_node) for lay in Layout.all_for_world(world)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("ranks_per_node", [1, 2])
@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_world_4_every_layout_across_nodes(pool, ranks_per_node, backend):
    cases = []
    for i, lay in enumerate(layouts(4, ranks_per_node)):
        cases += cases_for_layout(lay, dtypes=("bfloat16",), data="randn", device_sizes=(False, True), seed=i)
    run_checked(pool, 4, cases, backend=backend)
