"""Every op x group x layout of worlds 1, 2, 4 (and a reduced world 8) on gloo workers,
against the single-process oracle of hybridcomm.check: exact on integer data, bit for bit
on random data (the reference reduces in fp32 in group order, like the oracle)."""

import pytest
import torch

from hybridcomm import Layout
from hybridcomm.check import Case, cases_for_layout, check_cases, failures_of


def run_checked(pool, world, cases, backend="reference", exact="all", timeout=240):
    per_rank = pool(world).run(check_cases, cases, backend, exact, timeout=timeout)
    failures = failures_of(cases, per_rank)
    assert not failures, "\n".join(failures[:20])
    return per_rank


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [1, 2, 4])
def test_every_op_group_and_layout_exact_on_integer_data(pool, world):
    cases = []
    for lay in Layout.all_for_world(world):
        cases += cases_for_layout(lay, dtypes=("float32", "bfloat16"), device_sizes=(False, True))
        cases += cases_for_layout(lay, dtypes=("float16",), row_shape=(2, 4), seed=1)
    run_checked(pool, world, cases)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 4])
def test_random_data_is_bitwise_the_fp32_group_order_sum(pool, world):
    cases = []
    for lay in Layout.all_for_world(world):
        cases += cases_for_layout(lay, dtypes=("bfloat16", "float32"), data="randn", row_shape=(16,), seed=2)
    run_checked(pool, world, cases)


@pytest.mark.timeout(300)
def test_world_8_reduced(pool):
    layouts = [Layout(8), Layout(8, attn_tp=2, moe_tp=1), Layout(8, attn_tp=4, moe_tp=2), Layout(8, attn_tp=8, moe_tp=8)]
    cases = [c for lay in layouts for c in cases_for_layout(lay, dtypes=("bfloat16",), seed=3)]
    run_checked(pool, 8, cases)


def _scatter_on_sglang_layout(dp_sizes):
    import torch.distributed as dist
    import hybridcomm as hc

    lay = hc.Layout(4, attn_tp=2, moe_tp=2)
    comm = hc.Communicator(lay)
    rank = dist.get_rank()
    total = sum(dp_sizes)
    # Rank r contributes (r + 1) * (row index + 1): the reduced row i is 10 * (i + 1).
    y = torch.arange(1, total + 1, dtype=torch.float32)[:, None].repeat(1, 4) * (rank + 1)
    return comm.scatter_tokens(y, dp_sizes)


@pytest.mark.timeout(120)
def test_sglang_layout_scatter_returns_fully_reduced_rows_on_both_attn_tp_ranks(pool):
    """World 4, attn_tp = moe_tp = 2, attn_dp = moe_ep = 2: a single reduce-scatter is not
    enough here (SGLang PR 23713); both attn-TP ranks of a DP group need its reduced rows."""
    dp_sizes = [3, 2]
    out = pool(4).run(_scatter_on_sglang_layout, dp_sizes)
    rows = torch.arange(1, 6, dtype=torch.float32)[:, None].repeat(1, 4) * 10
    for rank in range(4):
        d = rank // 2
        want = rows[:3] if d == 0 else rows[3:]
        assert torch.equal(out[rank], want), f"rank {rank}"
    assert torch.equal(out[0], out[1]) and torch.equal(out[2], out[3])


def test_a_wrong_result_is_caught():
    """The checker itself must fail on a wrong answer (a test that cannot fail proves nothing)."""
    from hybridcomm.check import compare
    a = torch.randn(4, 8).bfloat16()
    b = a.clone()
    b[2, 3] += 1
    assert compare(b, a, "all") and compare(b, a, "none")
    assert not compare(a.clone(), a, "all")
    assert compare(a[:3], a, "all")  # wrong row count
