"""The Lamport protocol's CPU-side facts: the reserved-pattern semantics every backend shares,
the workspace layout with Lamport slots, and the table that forces the Lamport kernels.
(Kernels themselves: tests/test_gpu_lamport.py.)"""

import pytest
import torch

from hybridcomm import Layout, abi, algorithms, ops, workspace
from hybridcomm.check import Case, cases_for_layout, check_cases, compare, expected, member_input
from hybridcomm.reserved import INT_OF_WIDTH, fix_reserved

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_only_all_ones_elements_change_and_they_stay_nan(dtype):
    ints = INT_OF_WIDTH[torch.finfo(dtype).bits // 8]
    bits = torch.randint(torch.iinfo(ints).min, torch.iinfo(ints).max, (4096,), dtype=ints)
    bits[::7] = -1  # all ones
    bits[1::7] = -2  # already the replacement: stays
    x = bits.view(dtype)
    got = fix_reserved(x).view(ints)
    reserved = bits == -1
    assert torch.equal(got[~reserved], bits[~reserved])
    assert (got[reserved] == -2).all()
    assert torch.isnan(fix_reserved(x)[reserved]).all()
    assert not (got == -1).any()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_no_32_bit_word_of_fixed_data_is_the_sentinel(dtype):
    # The kernels' guarantee: after the fix no 32-bit word equals 0xFFFFFFFF, whatever the
    # neighbouring 16-bit element holds.
    ints = INT_OF_WIDTH[torch.finfo(dtype).bits // 8]
    bits = torch.full((1024,), -1, dtype=ints)
    bits[::3] = torch.randint(-5, 5, bits[::3].shape, dtype=ints)
    words = fix_reserved(bits.view(dtype)).view(torch.int32)
    assert not (words == -1).any()


def test_the_oracle_sees_inputs_through_the_fix():
    lay = Layout(2)
    case = Case("all_gather_v", lay, (3, 2), row_shape=(8,), dtype="bfloat16", data="reserved")
    raw = member_input(case, 0, "cpu")
    assert (raw.view(torch.int16) == -1).any()  # the data kind really carries the pattern
    want = expected(case, 0, "cpu")
    assert torch.equal(want[:3].view(torch.int16), fix_reserved(raw).view(torch.int16))


def test_reference_backend_matches_the_oracle_bit_for_bit_on_reserved_inputs(pool):
    cases = []
    for i, lay in enumerate([Layout(4, attn_tp=2), Layout(4)]):
        cases += cases_for_layout(lay, dtypes=("float32", "bfloat16", "float16"), data="reserved", seed=40 + i)
    per_rank = pool(4).run(check_cases, cases, "reference", "all")
    failures = [f"rank {o.rank}: {o.case}: {o.detail}" for outs in per_rank for o in outs if not o.ok]
    assert not failures, "\n".join(failures[:20])


def test_compare_sees_a_changed_nan_payload():
    a = torch.tensor([-1, 5], dtype=torch.int32).view(torch.float32)
    b = torch.tensor([-2, 5], dtype=torch.int32).view(torch.float32)
    assert compare(a, b, "all")


@pytest.mark.parametrize("members", [2, 4, 8])
def test_region_holds_three_lamport_slots_after_the_ll_slots(members):
    area = 4 << 20
    assert workspace.ll_bytes(members, area) == abi.FLAG_BYTES + 4 * members * area
    assert workspace.chunked_offset(members, area) == workspace.ll_bytes(members, area) + 3 * members * area
    assert ops.LAMPORT.capacity(area) == area  # data 1:1: twice the LL payload of an area


def test_info_total_counts_the_lamport_slots():
    lay = Layout(4, attn_tp=2)
    plan = workspace.memory_plan(lay, 1 << 20)
    text = workspace.describe_plan(lay, 1 << 20)
    total = sum(size for _, _, size in plan)
    assert f"{total / 2**20:.1f} MiB per GPU" in text
    assert total == sum(workspace.region_bytes(n, 1 << 20) for _, n, _ in plan)


def test_every_op_has_a_lamport_one_shot_and_the_lamport_table_forces_it():
    table = algorithms.NAMED_TABLES["lamport"]
    for op in ("all_reduce", "all_gather_v", "reduce_scatter_v", "gather_tokens", "scatter_tokens"):
        assert ops.OPS[op].algorithm(algorithms.LAMPORT).protocol is ops.LAMPORT
        assert table[op] == (algorithms.Rule(None, "nvlink", algorithms.LAMPORT),)
