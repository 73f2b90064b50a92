"""Counts from one's own count: ops given only this rank's count exchange it and agree with
the all-counts form, on every layout of world 4."""

import pytest
import torch
import torch.distributed as dist

import hybridcomm as hc
from hybridcomm.layout import Layout

DP_COUNTS = {1: [5], 2: [3, 0], 4: [2, 0, 7, 1]}


def _own_counts_case(attn_tp: int, moe_tp: int):
    layout = Layout(dist.get_world_size(), attn_tp=attn_tp, moe_tp=moe_tp)
    comm = hc.Communicator(layout)
    for on_device in (False, True):
        _check_own_counts(comm, layout, on_device)
    return True


def _check_own_counts(comm, layout, on_device):
    rank = dist.get_rank()
    coords = layout.coords(rank)
    dp_sizes = DP_COUNTS[layout.attn_dp]
    mine = dp_sizes[coords.attn_dp_rank]
    torch.manual_seed(100 + rank)
    capacity = max(dp_sizes) if on_device else mine  # device sizes: every rank the same capacity
    x = torch.randn(capacity, 8)
    own = torch.tensor([mine], dtype=torch.int32) if on_device else mine
    counts = hc.Counts(own)
    got = comm.gather_tokens(x, counts)
    want = comm.gather_tokens(x[:mine], dp_sizes)
    exchanged = counts.sizes.tolist() if on_device else list(counts.sizes)
    assert exchanged == dp_sizes, exchanged
    total = sum(dp_sizes)
    assert torch.equal(got[:total], want)
    y = torch.randn(got.shape[0], 8)
    scattered = comm.scatter_tokens(y, counts)
    expected = comm.scatter_tokens(y[:total], dp_sizes)
    assert torch.equal(scattered[:mine], expected)
    # all_gather_v over the world from one's own count
    world_counts = [r % 3 for r in range(layout.world_size)]
    z = torch.randn(world_counts[rank], 4)
    c = hc.Counts(world_counts[rank])
    assert torch.equal(comm.all_gather_v(z, c), comm.all_gather_v(z, world_counts))
    assert list(c.sizes) == world_counts


@pytest.mark.parametrize("attn_tp,moe_tp", [(1, 1), (2, 1), (4, 1), (2, 2)])
def test_own_counts_match_all_counts(pool, attn_tp, moe_tp):
    assert all(pool(4).run(_own_counts_case, attn_tp, moe_tp))


def _reuse_over_other_group_size():
    comm = hc.Communicator(Layout(4, attn_tp=2))
    counts = hc.Counts(1)
    comm.gather_tokens(torch.randn(1, 4), counts)  # exchanged over attn_dp: 2 members
    with pytest.raises(ValueError, match="exchanged over group 'attn_dp'"):
        comm.all_gather_v(torch.randn(1, 4), counts, group="world")
    return True


def test_counts_reused_over_a_group_of_another_size(pool):
    assert all(pool(4).run(_reuse_over_other_group_size))


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3", torch.tensor([1, 2], dtype=torch.int32),
                                 torch.tensor([1.0])])
def test_bad_own_count(bad):
    with pytest.raises((TypeError, ValueError), match="own"):
        hc.Counts(bad)


def _own_count_left_to_the_kernel_or_exchanged():
    from hybridcomm import collectives
    from hybridcomm import counts as counts_mod

    rank, n = dist.get_rank(), dist.get_world_size()
    comm = hc.Communicator(Layout(n, attn_tp=2))
    world, cpu = comm.groups["world"], torch.device("cpu")
    own = lambda: torch.tensor([rank + 1], dtype=torch.int32)  # noqa: E731
    assert counts_mod.in_kernel(hc.Counts(rank), world, cpu) is None  # an int: exchanged before the op
    kernel = object()  # stands for the nvlink backend, which a CPU communicator has not
    comm.backends["nvlink"] = kernel
    # The chosen algorithm's registry entry (ops.Algorithm.own_count) decides.
    calls = []
    real = collectives.all_gather_single
    collectives.all_gather_single = lambda *a, **k: calls.append(a) or real(*a, **k)
    try:
        for op, algorithm in (("gather_tokens", "one_shot_lamport"), ("gather_tokens_quant", "quant"),
                              ("gather_tokens_quant", "quant_lamport")):
            left = hc.Counts(own())
            s = counts_mod.in_kernel(left, world, cpu)
            assert s.own is not None and tuple(s.device.shape) == (n,) and s.device.dtype == torch.int32
            assert comm._settle_counts(left, s, op, kernel, algorithm, world) is s
            assert left.sizes is s.device and left.group == "world" and not calls  # for the kernel to fill
            assert counts_mod.in_kernel(left, world, cpu) is None  # exchanged (by that kernel) once
        for op, backend, algorithm in (("scatter_tokens", kernel, "one_shot"),
                                       ("gather_tokens", comm.backends["reference"], None)):
            before = len(calls)
            now = hc.Counts(own())
            settled = comm._settle_counts(now, counts_mod.in_kernel(now, world, cpu), op, backend, algorithm, world)
            assert len(calls) == before + 1 and settled.own is None
            assert settled.device.tolist() == list(range(1, n + 1)) and now.sizes is settled.device
    finally:
        collectives.all_gather_single = real
        del comm.backends["nvlink"]
    return True


def test_own_device_count_is_left_to_kernels_that_exchange_it_and_exchanged_before_others(pool):
    assert all(pool(4).run(_own_count_left_to_the_kernel_or_exchanged))
