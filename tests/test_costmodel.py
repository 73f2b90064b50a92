"""The cost model across nodes: its in-node parameters come from our 4x H200 results, costs grow
with bytes, and one case matches a calculation by hand."""

import pytest

from hybridcomm import Layout, costmodel
from hybridcomm.costmodel import NCCL_4xH200, OURS_4xH200, Params


def test_in_node_parameters_are_the_ones_derived_from_the_4xh200_results():
    ours, nccl = costmodel.in_node_legs()
    for op in costmodel.OPS:
        assert ours[op].latency_us == pytest.approx(OURS_4xH200[op].latency_us, abs=0.01)
        assert ours[op].gbps == pytest.approx(OURS_4xH200[op].gbps, rel=0.01)
        assert nccl[op].latency_us == pytest.approx(NCCL_4xH200[op].latency_us, abs=0.01)
        assert nccl[op].gbps == pytest.approx(NCCL_4xH200[op].gbps, rel=0.01)


@pytest.mark.parametrize("op", costmodel.OPS)
@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_every_cost_grows_with_bytes(op, nodes):
    p = Params()
    sizes = [0, 2 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]
    for fn in (lambda b: costmodel.flat_nccl(op, b, nodes * 8, nodes, p),
               lambda b: costmodel.hierarchical(op, b, nodes * 8, nodes, p)[0]):
        costs = [fn(b) for b in sizes]
        assert costs == sorted(costs) and costs[-1] > costs[0]
    lay = Layout(nodes * 8, attn_tp=2, ranks_per_node=8)
    for op_t in ("gather_tokens", "scatter_tokens"):
        for mode in costmodel.MODES:
            costs = [costmodel.transition_us(op_t, lay, t, 8192, p, mode) for t in (1, 16, 256, 4096)]
            assert costs == sorted(costs) and costs[-1] > costs[0]


def test_all_gather_across_two_nodes_by_hand():
    """2 x 8 GPUs, 16 tokens of 8 KiB per GPU (2 MiB gathered), 50 GB/s and 5 µs per hop.
    Flat NCCL: 17.301 + 1 hop * 5 + 15/16 * 2 MiB / min(269.4, 8 * 50) GB/s.
    Ours: rail all-gather 17.301 + 5 + 1 * 128 KiB / 50 GB/s, then our in-node all-gather of
    2 MiB over 8 GPUs: 5.890 + 7/8 * 2 MiB / 156.1 GB/s."""
    p = Params(net_gbps=50, hop_us=5)
    mib = 1 << 20
    flat = 17.301 + 5 + 15 / 16 * 2 * mib / 269.4e3
    ours = (17.301 + 5 + 128 * 1024 / 50e3) + (5.890 + 7 / 8 * 2 * mib / 156.1e3)
    assert costmodel.flat_nccl("all_gather_v", 2 * mib, 16, 2, p) == pytest.approx(flat, rel=1e-6)
    assert costmodel.hierarchical("all_gather_v", 2 * mib, 16, 2, p) == (pytest.approx(ours, rel=1e-6), "rail_first")


def test_cli_prints_a_table_per_node_count(capsys):
    from hybridcomm.cli import main

    assert main(["model", "--nodes", "2,4", "--tokens", "1,2048", "--sizes", "2048"]) == 0
    out = capsys.readouterr().out
    assert "2 x 8 GPUs" in out and "4 x 8 GPUs" in out and "| gather_tokens | dp16xtp2 | 2048 |" in out
