"""Groups across (simulated) nodes on gloo workers: every op x group x layout with
ranks_per_node set, through the hierarchical algorithms (backend "auto") and the reference,
against the oracle bit for bit (the order across nodes is topology.sum_by_node's); a peer of
the second node that skips a call; the internal node and rail groups."""

import pytest
import torch

from conftest import gpu_world, needs_gpus, needs_nccl
from hybridcomm import Layout
from hybridcomm.check import Case, cases_for_layout, check_cases, failures_of, replay_check
from hybridcomm.spmd import SpmdPool
from hybridcomm.topology import has_rails, split, sum_by_node, sum_in_order


def run_checked(pool, world, cases, backend="auto", table="hierarchical", exact="all", device="cpu", timeout=300):
    """Every case on every rank against the oracle (table "hierarchical": our path across nodes
    at every size; "auto": the default table, where flat NCCL rules run the reference on CPU)."""
    per_rank = pool(world, device).run(check_cases, cases, backend, exact, False, table, timeout=timeout)
    failures = failures_of(cases, per_rank)
    assert not failures, "\n".join(failures[:20])


def layouts(world: int, ranks_per_node: int) -> list[Layout]:
    return [Layout(world, lay.attn_tp, lay.moe_tp, ranks_per_node) for lay in Layout.all_for_world(world)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("ranks_per_node, backend, table", [
    (1, "auto", "hierarchical"), (2, "auto", "hierarchical"), (2, "auto", "auto"),
    (1, "reference", "auto"), (2, "reference", "auto")])
def test_world_4_every_layout_across_nodes(pool, ranks_per_node, backend, table):
    cases = []
    for i, lay in enumerate(layouts(4, ranks_per_node)):
        cases += cases_for_layout(lay, dtypes=("bfloat16", "float32"), data="randn", device_sizes=(False, True),
                                  seed=i)
    run_checked(pool, 4, cases, backend, table)


def _large_all_reduce_cases(layout: Layout) -> list[Case]:
    """Above the one-shot limit of the table for groups across nodes: the two-shot path, with
    rows of 16 bytes and (row shape (3,)) without."""
    return [Case("all_reduce", layout, (rows,), group, row_shape, "bfloat16", "randn", seed=7)
            for group in ("world", "attn_dp") for rows, row_shape in ((20000, (8,)), (50001, (3,)))]


@pytest.mark.timeout(300)
def test_world_4_two_shot_all_reduce_across_nodes(pool):
    run_checked(pool, 4, _large_all_reduce_cases(Layout(4, attn_tp=2, ranks_per_node=2)))


WORLD_8 = [Layout(8, attn_tp=2, moe_tp=1, ranks_per_node=4), Layout(8, attn_tp=4, moe_tp=2, ranks_per_node=2),
           Layout(8, attn_tp=1, moe_tp=4, ranks_per_node=2), Layout(8, attn_tp=8, moe_tp=1, ranks_per_node=4)]


@pytest.mark.timeout(300)
def test_world_8_across_2_and_4_nodes(pool):
    cases = []
    for i, lay in enumerate(WORLD_8):
        # bf16 shows the rounding per node; fp32 (sums of few bf16 values are exact in fp32) the order
        cases += cases_for_layout(lay, dtypes=(("bfloat16", "float32")[i % 2],), data="randn",
                                  device_sizes=(i % 2 == 0,), seed=i)
    cases += _large_all_reduce_cases(WORLD_8[1])[:1]
    run_checked(pool, 8, cases)


def _selections(layout: Layout) -> dict:
    from hybridcomm.arguments import parse_sizes
    from hybridcomm.check import communicator

    comm = communicator(layout)
    x = torch.zeros(4, 8)
    chosen = {name: comm._select("all_reduce", comm.groups[name], x)[0].name
              for name in ("world", "attn_tp", "attn_dp", "moe_tp", "moe_ep")}
    world = comm.groups["world"]
    chosen["world 1 MiB"] = comm._select("all_reduce", world, torch.zeros(1 << 18))[0].name
    for where, sizes in (("host", [1] * 4), ("device", torch.ones(4, dtype=torch.int32))):
        s = parse_sizes(sizes, 4, comm.device, "sizes")
        chosen[f"all_gather_v {where} sizes"] = comm._select("all_gather_v", world, x, s, world.index)[0].name
    return chosen


def test_groups_across_nodes_take_the_hierarchical_legs_on_cpu_and_groups_in_a_node_keep_theirs(pool):
    lay = Layout(4, attn_tp=2, moe_tp=2, ranks_per_node=2)
    chosen = pool(4).run(_selections, lay)[0]
    # CPU has no NCCL: where the table prefers flat NCCL, CPU runs the legs too.
    assert chosen == {"world": "hierarchical", "attn_tp": "reference", "attn_dp": "hierarchical",
                      "moe_tp": "reference", "moe_ep": "hierarchical", "world 1 MiB": "hierarchical",
                      "all_gather_v host sizes": "hierarchical", "all_gather_v device sizes": "hierarchical"}


def test_the_table_across_nodes_picks_hierarchical_or_flat_nccl():
    from hybridcomm.algorithms import KiB, MiB, choose_across_nodes

    assert choose_across_nodes("all_reduce", 2 * KiB, 2, False).backend == "hierarchical"
    assert choose_across_nodes("all_reduce", 1 * MiB, 4, False).backend == "nccl"
    assert choose_across_nodes("all_gather_v", 2 * KiB, 2, False).backend == "nccl"
    assert choose_across_nodes("all_gather_v", 2 * KiB, 2, True).backend == "hierarchical"  # device sizes
    assert choose_across_nodes("gather_tokens", 1 * MiB, 2, False).backend == "hierarchical"
    assert choose_across_nodes("scatter_tokens", 128 * MiB, 2, False).backend == "nccl"


def test_node_parts_and_rails():
    s = split(Layout(8, attn_tp=2, ranks_per_node=4), (0, 2, 4, 6))
    assert s.node_part(6) == (4, 6) and s.rail(6) == (2, 6) and s.per_node == 2
    assert has_rails(Layout(8, ranks_per_node=4), tuple(range(8)))
    assert not has_rails(Layout(8, attn_tp=2, ranks_per_node=4), (0, 1))  # one node


def test_order_across_nodes_rounds_each_node_once():
    parts = [torch.randn(1000).bfloat16() for _ in range(4)]
    across = sum_by_node(parts, (0, 0, 1, 1), torch.bfloat16)
    node_sums = [(parts[0].float() + parts[1].float()).bfloat16(), (parts[2].float() + parts[3].float()).bfloat16()]
    assert torch.equal(across, node_sums[0].float() + node_sums[1].float())
    assert torch.equal(sum_by_node(parts, (0, 0, 0, 0), torch.bfloat16), sum_in_order(parts))
    assert not torch.equal(across.bfloat16(), sum_in_order(parts).bfloat16())  # the orders do differ


def _skip_one_call(skipper: int, timeout_s: float):
    import time

    import torch.distributed as dist

    import hybridcomm as hc

    comm = hc.Communicator(Layout(4, ranks_per_node=2), timeout_s=timeout_s)
    x = torch.randn(4, 8)
    comm.all_reduce(x)  # every rank: the groups work
    if dist.get_rank() == skipper:
        return None
    t0 = time.monotonic()
    try:
        comm.all_reduce(x)
    except hc.PeerTimeout as e:
        return {"op": e.op, "group": e.group, "peer": e.peer, "message": str(e), "s": time.monotonic() - t0}
    return "no error"


@pytest.mark.timeout(120)
def test_a_rank_of_the_second_node_that_skips_a_call_fails_every_other_rank_in_time():
    with SpmdPool(4) as p:
        got = p.run(_skip_one_call, 3, 2.0, timeout=60)
        p.close(kill=True)  # the groups saw a timeout: nothing more runs on them
    assert got[3] is None
    for rank in (0, 1, 2):
        assert isinstance(got[rank], dict), f"rank {rank}: {got[rank]}"
        assert got[rank]["op"] == "all_reduce" and got[rank]["group"] == "world", got[rank]
    # Ranks 1 (rail 1-3) and 2 (node 2-3) wait for rank 3 itself; rank 0's rail peer is rank 2.
    assert got[1]["peer"] == 3 and got[2]["peer"] == 3 and got[0]["peer"] == 2
    assert "did not arrive within 2 s" in got[0]["message"]


# -- on GPUs: two simulated nodes of gpu_world() / 2 GPUs (the cross-node legs really run on NCCL) --
def _gpu_world() -> tuple[int, int]:
    world = gpu_world()
    return world, world // 2


def _gpu_exactness(ranks_per_node: int) -> str:
    """One GPU per node: the legs in a node copy, the rails move raw bytes: bit for bit but the
    fused norm. More per node: a leg in a node may run on NCCL (its own order): tolerance."""
    return "sums" if ranks_per_node == 1 else "none"


@pytest.mark.gpu
@needs_gpus(2)
@pytest.mark.timeout(900)
def test_gpu_every_op_and_layout_across_two_simulated_nodes(pool):
    world, rpn = _gpu_world()
    cases = []
    for i, lay in enumerate(layouts(world, rpn)):
        cases += cases_for_layout(lay, dtypes=("bfloat16", "float32"), data="randn", row_shape=(256,),
                                  device_sizes=(False, True), seed=i)
        cases += _large_all_reduce_cases(lay)
    run_checked(pool, world, cases, exact=_gpu_exactness(rpn), device="cuda", timeout=800)
    run_checked(pool, world, cases, table="auto", exact="none", device="cuda", timeout=800)


@pytest.mark.gpu
@needs_gpus(2)
@needs_nccl()  # the rails' legs run torch.distributed collectives in the graph: gloo cannot be captured
@pytest.mark.timeout(900)
@pytest.mark.parametrize("op, group, fused", [("all_gather_v", "world", False), ("reduce_scatter_v", "world", False),
                                              ("gather_tokens", "world", False), ("gather_tokens", "world", True),
                                              ("scatter_tokens", "world", False)])
def test_gpu_graph_replays_with_new_device_side_counts_across_nodes(pool, op, group, fused):
    world, rpn = _gpu_world()
    for lay in (Layout(world, ranks_per_node=rpn), Layout(world, attn_tp=2, ranks_per_node=rpn)):
        count = lay.attn_dp if op.endswith("tokens") else world
        template = Case(op, lay, (0,) * count, group, row_shape=(256,), dtype="bfloat16", data="randn",
                        fused=fused, device_sizes=True)
        per_rank = pool(world, "cuda").run(replay_check, template, 200, 6, "hierarchical", 3, _gpu_exactness(rpn),
                                           timeout=800)
        for rank, result in enumerate(per_rank):
            assert result["mismatches"] == 0, f"{op} {lay.name} rank {rank}: {result['failures']}"


def test_nvlink_regions_cover_the_groups_inside_a_node_and_the_node_parts():
    from hybridcomm.workspace import region_groups

    keys, blocker = region_groups(Layout(16, attn_tp=2, ranks_per_node=8))
    assert blocker is None
    assert set(keys) == {"attn_tp", "world/node", "attn_dp/node", "moe_ep/node"}
    assert keys["attn_dp/node"] == ((0, 2, 4, 6), (1, 3, 5, 7), (8, 10, 12, 14), (9, 11, 13, 15))
    assert region_groups(Layout(4, ranks_per_node=1)) == ({}, "no group of 2+ ranks inside one node")
