"""Bad input raises a clear exception before any communication -- never a hang."""

import pytest
import torch

BAD_CALLS = {
    # name: (call, expected exception, words the message must contain)
    "sizes too short": (lambda c, x: c.all_gather_v(x, [2]), ValueError, ["sizes", "expected 2 sizes", "got 1"]),
    "own rows differ": (lambda c, x: c.all_gather_v(x, [3, 3]), ValueError, ["x", "expected 3 rows", "got 2"]),
    "rs rows differ": (lambda c, x: c.reduce_scatter_v(x, [1, 2]), ValueError, ["x", "expected 3 rows", "sum(sizes)"]),
    "negative size": (lambda c, x: c.all_gather_v(x, [2, -1]), ValueError, ["sizes[1]", "non-negative"]),
    "float size": (lambda c, x: c.all_gather_v(x, [2, 2.0]), ValueError, ["sizes[1]", "non-negative int"]),
    "sizes not a sequence": (lambda c, x: c.all_gather_v(x, 4), TypeError, ["sizes", "sequence of ints"]),
    "sizes tensor dtype": (lambda c, x: c.all_gather_v(x, torch.tensor([2, 2])), TypeError, ["sizes", "int32", "int64"]),
    "sizes tensor length": (lambda c, x: c.all_gather_v(x, torch.tensor([2], dtype=torch.int32)), ValueError, ["sizes", "expected 2 sizes"]),
    "non-contiguous": (lambda c, x: c.all_reduce(torch.zeros(4, 4).t()), ValueError, ["x", "contiguous"]),
    "unsupported dtype": (lambda c, x: c.all_reduce(x.int()), TypeError, ["x", "unsupported dtype", "torch.int32"]),
    "wrong device": (lambda c, x: c.all_reduce(torch.zeros(2, 4, device="meta")), ValueError, ["x", "expected a tensor on cpu", "meta"]),
    "not a tensor": (lambda c, x: c.all_reduce([1.0, 2.0]), TypeError, ["x", "torch.Tensor", "list"]),
    "unknown group": (lambda c, x: c.all_reduce(x, group="tp"), ValueError, ["group", "'tp'", "attn_tp"]),
    "0-d tensor": (lambda c, x: c.all_reduce(torch.tensor(1.0)), ValueError, ["x", "0-d"]),
    "dp_sizes length": (lambda c, x: c.gather_tokens(x, [2]), ValueError, ["dp_sizes", "expected 2 sizes"]),
    "gather rows": (lambda c, x: c.gather_tokens(x, [1, 1]), ValueError, ["x", "dp_sizes[", "expected 1 rows"]),
    "scatter rows": (lambda c, x: c.scatter_tokens(x, [1, 2]), ValueError, ["y", "expected 3 rows"]),
    "residual alone": (lambda c, x: c.gather_tokens(x, [2, 2], residual=x), ValueError, ["residual and norm_weight"]),
    "residual shape": (lambda c, x: c.gather_tokens(x, [2, 2], residual=x[:1], norm_weight=x[0]), ValueError, ["residual", "expected shape (2, 4)"]),
    "norm weight shape": (lambda c, x: c.gather_tokens(x, [2, 2], residual=x, norm_weight=x), ValueError, ["norm_weight", "expected shape (4,)"]),
    "negative eps": (lambda c, x: c.gather_tokens(x, [2, 2], residual=x, norm_weight=x[0], eps=-1.0), ValueError, ["eps"]),
}


def _bad_calls():
    import hybridcomm as hc
    comm = hc.Communicator(hc.Layout(2))
    x = torch.ones(2, 4)
    raised = {}
    for name, (call, _, _) in BAD_CALLS.items():
        try:
            call(comm, x)
            raised[name] = None
        except Exception as e:
            raised[name] = (type(e).__name__, str(e))
    # Nothing was exchanged: the communicator still works afterwards.
    ok = torch.equal(comm.all_reduce(x), 2 * x)
    return raised, ok


@pytest.mark.timeout(120)
def test_every_bad_input_raises_a_clear_exception_and_leaves_the_communicator_usable(pool):
    for raised, ok in pool(2).run(_bad_calls):
        for name, (_, exc, words) in BAD_CALLS.items():
            assert raised[name] is not None, f"{name}: nothing raised"
            kind, message = raised[name]
            assert kind == exc.__name__, f"{name}: raised {kind}: {message}"
            for w in words:
                assert w in message, f"{name}: {w!r} not in {message!r}"
        assert ok


def _validated_mismatch(case):
    import torch.distributed as dist
    import hybridcomm as hc
    comm = hc.Communicator(hc.Layout(4, attn_tp=2), validate=True)
    rank = dist.get_rank()
    try:
        if case == "sizes differ":
            sizes = [1, 2, 3, 4] if rank != 2 else [1, 2, 3, 5]
            comm.all_gather_v(torch.ones(sizes[rank], 4), sizes)
        elif case == "one rank rejected":
            rows = 5 if rank == 3 else 2
            comm.gather_tokens(torch.ones(rows, 4), [2, 2])
        elif case == "device sizes differ":
            sizes = torch.tensor([3, 1] if rank == 0 else [3, 2], dtype=torch.int32)
            comm.scatter_tokens(torch.ones(6, 4), sizes)
        elif case == "attn_tp group only":
            sizes = [1, 1] if rank < 2 else [1, 2]  # differs between groups: fine
            comm.all_gather_v(torch.ones(sizes[rank % 2], 4), sizes, group="attn_tp")
            return None
    except ValueError as e:
        return str(e)
    return None


@pytest.mark.timeout(120)
def test_validate_cross_checks_sizes_and_names_the_rank_that_disagrees(pool):
    out = pool(4).run(_validated_mismatch, "sizes differ")
    assert out[0] is not None and out == [out[0]] * 4  # the same message on every rank
    assert "rank 0 passed [1, 2, 3, 4], rank 2 passed [1, 2, 3, 5]" in out[0]

    out = pool(4).run(_validated_mismatch, "one rank rejected")
    assert "expected 2 rows" in out[3]
    assert all("rank 3 rejected its arguments" in m for m in out[:3])

    out = pool(4).run(_validated_mismatch, "device sizes differ")
    assert out[0] is not None and out == [out[0]] * 4
    assert "disagree on dp_sizes: rank 0 passed [3, 1], rank 1 passed [3, 2]" in out[0]

    assert pool(4).run(_validated_mismatch, "attn_tp group only") == [None] * 4



def test_communicator_needs_torch_distributed():
    import hybridcomm as hc
    with pytest.raises(RuntimeError, match="initialise torch.distributed first"):
        hc.Communicator(hc.Layout(1))


def _wrong_world():
    import hybridcomm as hc
    try:
        hc.Communicator(hc.Layout(4))
    except ValueError as e:
        return str(e)


def test_layout_world_must_match_torch_distributed(pool):
    for msg in pool(2).run(_wrong_world):
        assert "world_size=4 but torch.distributed has 2 ranks" in msg


def _bad_max_sms():
    import hybridcomm as hc
    messages = []
    for value in (0, -3, 2.5, True, "8"):
        try:
            hc.Communicator(hc.Layout(2), max_sms=value)
        except ValueError as e:
            messages.append(str(e))
    return messages


def test_max_sms_must_be_a_positive_int(pool):
    for messages in pool(2).run(_bad_max_sms):
        assert len(messages) == 5
        assert all(m.startswith("max_sms: expected a positive int or None, got") for m in messages)


def _agreed_blocks(sms_per_rank, requested):
    """workspace.agreed_max_blocks on gloo ranks whose 'GPUs' have sms_per_rank[rank] SMs."""
    from types import SimpleNamespace
    from unittest import mock

    import torch.distributed as dist

    from hybridcomm import workspace

    sms = sms_per_rank[dist.get_rank()]
    gpu = SimpleNamespace(multi_processor_count=sms)
    with mock.patch.object(torch.cuda, "get_device_properties", lambda device: gpu):
        return workspace.agreed_max_blocks(torch.device("cuda", 0), dist.group.WORLD, requested[dist.get_rank()])


def test_the_ranks_agree_on_the_smallest_grid(pool):
    from hybridcomm.abi import MAX_BLOCKS

    run = pool(2).run
    assert run(_agreed_blocks, [132, 78], [None, None]) == [78, 78]  # GPUs of two sizes: the smaller
    assert run(_agreed_blocks, [132, 132], [8, 16]) == [8, 8]  # max_sms differs: the smallest
    assert run(_agreed_blocks, [132, 132], [1000, None]) == [132, 132]  # never more than the SMs
    assert run(_agreed_blocks, [400, 400], [None, None]) == [MAX_BLOCKS, MAX_BLOCKS]
