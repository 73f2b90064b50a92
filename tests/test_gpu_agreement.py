"""GPU tests of the device-side agreement check (skipped without 2 GPUs; world 4 where 4 exist).

One rank passes a call that differs from its peers' (row counts, dtype, row width, another
op in its place); every rank must raise ArgumentMismatch naming a peer whose call differs
(the good ranks: the bad rank), no kernel may hang, and the next valid call must work.
Errors are collected with `check_errors()`, which synchronises, so every rank raises at the
same point.
"""

import pytest
import torch

from conftest import gpu_world, needs_gpus

pytestmark = [pytest.mark.gpu, needs_gpus(2)]

WORLD = gpu_world()
BAD = 1  # the rank whose call differs
TIMEOUT_S = 5.0  # a hang shows as PeerTimeout (a failure) instead of blocking the suite

_communicators: dict = {}


def _comm(layout):
    import hybridcomm as hc

    if layout not in _communicators:
        _communicators[layout] = hc.Communicator(layout, timeout_s=TIMEOUT_S)
    return _communicators[layout]


def _outcome(comm, run) -> dict:
    """Run `run()` (the call that differs on rank BAD), collect the error, then check that a
    valid call works: an all_reduce of ones over the world sums to the world size."""
    import hybridcomm as hc

    error = None
    try:
        run()
        comm.check_errors()
    except hc.ArgumentMismatch as e:
        error = {"op": e.op, "group": e.group, "peer": e.peer, "field": e.field, "message": str(e),
                 "value_error": isinstance(e, ValueError)}
    except hc.HybridCommError as e:  # PeerTimeout, CapacityExceeded: not what this test wants
        error = {"other": f"{type(e).__name__}: {e}"}
    total = comm.all_reduce(torch.ones(1024, device="cuda"))
    comm.check_errors()
    return {"error": error, "next_call_ok": bool((total == comm.layout.world_size).all())}


def _counts(rank: int, n: int, own: int) -> list[int]:
    """Rows per member (or DP group): the same list on every rank but BAD, whose view has one
    more row for the member after its own index `own` (its own rows stay consistent)."""
    sizes = [2 + i % 3 for i in range(n)]
    if rank == BAD:
        sizes[(own + 1) % n] += 1
    return sizes


def _group_op_case(case: str) -> dict:
    import torch.distributed as dist

    import hybridcomm as hc

    rank, comm = dist.get_rank(), _comm(hc.Layout(WORLD))
    bad = rank == BAD
    if case == "counts":
        sizes = _counts(rank, WORLD, BAD)
        x = torch.randn(sizes[rank], 64, device="cuda")
        return _outcome(comm, lambda: comm.all_gather_v(x, sizes))
    if case == "dtype":  # the same bytes: 256 fp32 or 512 bf16 values per row
        x = (torch.randn(WORLD, 512, device="cuda", dtype=torch.bfloat16) if bad
             else torch.randn(WORLD, 256, device="cuda"))
        return _outcome(comm, lambda: comm.reduce_scatter_v(x, [1] * WORLD))  # a row per rank
    if case == "dtype_all_reduce":
        x = torch.randn(512, device="cuda", dtype=torch.bfloat16) if bad else torch.randn(256, device="cuda")
        return _outcome(comm, lambda: comm.all_reduce(x))
    if case == "width":
        sizes = [2] * WORLD
        x = torch.randn(2, 32 if bad else 64, device="cuda")
        return _outcome(comm, lambda: comm.all_gather_v(x, sizes))
    if case == "reordered":
        # Captured in a graph, so that no host-side check runs between the two calls (eagerly,
        # a rank that already sees the first call's error would refuse the second one while its
        # peers wait for it).
        x, y, sizes = torch.randn(256, device="cuda"), torch.randn(2, 64, device="cuda"), [2] * WORLD
        comm.all_reduce(x), comm.all_gather_v(y, sizes)  # warm up outside capture
        comm.check_errors()
        graph = torch.cuda.CUDAGraph()

        def run():
            with torch.cuda.graph(graph):
                if bad:
                    comm.all_gather_v(y, sizes), comm.all_reduce(x)
                else:
                    comm.all_reduce(x), comm.all_gather_v(y, sizes)
            graph.replay()

        return _outcome(comm, run)
    raise ValueError(case)


def _transition_case(world: int, attn_tp: int, op: str) -> dict:
    import torch.distributed as dist

    import hybridcomm as hc

    layout = hc.Layout(world, attn_tp=attn_tp)
    rank, comm = dist.get_rank(), _comm(layout)
    d = layout.coords(rank).attn_dp_rank
    if layout.attn_dp == 1:  # one DP group: the bad rank disagrees on its own group's rows
        dp_sizes = [3 if rank == BAD else 2]
    else:
        dp_sizes = _counts(rank, layout.attn_dp, layout.coords(BAD).attn_dp_rank)
    if op == "gather_tokens":
        x = torch.randn(dp_sizes[d], 64, device="cuda")
        return _outcome(comm, lambda: comm.gather_tokens(x, dp_sizes))
    y = torch.randn(sum(dp_sizes), 64, device="cuda")
    return _outcome(comm, lambda: comm.scatter_tokens(y, dp_sizes))


def _check(results, ops, field=None):
    for rank, result in enumerate(results):
        error = result["error"]
        assert error is not None, f"rank {rank}: no ArgumentMismatch"
        assert "other" not in error, f"rank {rank}: {error['other']}"
        assert error["op"] in ops and error["group"] == "world", f"rank {rank}: {error}"
        assert error["value_error"]
        if rank == BAD:
            assert error["peer"] != BAD, error["message"]
        else:  # every rank that received the bad call names the bad rank
            assert error["peer"] == BAD, error["message"]
            assert f"rank {BAD}'s call differs" in error["message"]
        if field is not None:
            assert error["field"].startswith(field), f"rank {rank}: {error['message']}"
        assert result["next_call_ok"], f"rank {rank}: the next valid call failed"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case, ops, field", [
    ("counts", {"all_gather_v"}, "row counts"),
    ("dtype", {"reduce_scatter_v"}, "dtype"),
    ("dtype_all_reduce", {"all_reduce"}, "dtype"),
    ("width", {"all_gather_v"}, "row width"),
    ("reordered", {"all_reduce", "all_gather_v"}, "op"),
])
def test_a_rank_whose_call_differs_makes_every_rank_raise_argument_mismatch(pool, case, ops, field):
    _check(pool(WORLD, "cuda").run(_group_op_case, case, timeout=120), ops, field)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("op", ["gather_tokens", "scatter_tokens"])
def test_transitions_with_counts_that_differ_raise_on_every_rank_of_every_layout(pool, op):
    from hybridcomm import Layout

    for attn_tp in sorted({lay.attn_tp for lay in Layout.all_for_world(WORLD)}):
        results = pool(WORLD, "cuda").run(_transition_case, WORLD, attn_tp, op, timeout=120)
        # With attn_tp = 1 the transitions run as all_gather_v / reduce_scatter_v over the world.
        _check(results, {op, {"gather_tokens": "all_gather_v", "scatter_tokens": "reduce_scatter_v"}[op]},
               "row counts")
