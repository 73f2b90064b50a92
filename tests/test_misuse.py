"""Mistakes that only show across ranks: every rank raises, nothing hangs or aborts, and the
next valid call works (CPU, 4 gloo processes, layout world 4 = attn_tp 2 x moe_tp 2).

Each case is one call made differently on some rank. With validate=True every rank raises
the same exception (a rank whose own local checks failed raises its own); without it the
reference backend's header exchange turns the mismatch into an exception on every rank.
Every pool call has a deadline: a hang fails the test (and kills the workers), an abort
inside gloo kills a worker and fails it too.
"""

import pytest
import torch

from hybridcomm.errors import ArgumentMismatch, CapacityExceeded, HybridCommError

BF16, F32 = torch.bfloat16, torch.float32


def _x(rank, rows, *trailing, dtype=F32):
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randn((rows,) + trailing, generator=g).to(dtype)


def _sizes(values):
    return torch.tensor(values, dtype=torch.int32)


def _fused(c, r, eps=1e-6):
    return c.gather_tokens(_x(r, 2, 4), [2, 2], residual=_x(r + 9, 2, 4), norm_weight=_x(r, 4), eps=eps)


# name: (call(comm, rank), words the message of a detecting rank names, exception types every
#        rank raises, ranks whose own local checks fail, only detectable with validate=True)
MISMATCH = (ValueError,)
CASES = {
    "dtype": (lambda c, r: c.all_reduce(_x(r, 2, 4, dtype=BF16 if r == 1 else F32)),
              ["dtype", "torch.bfloat16", "rank 1"], MISMATCH, (), False),
    "trailing shape": (lambda c, r: c.all_gather_v(_x(r, r + 1, 8 if r == 2 else 4), [1, 2, 3, 4]),
                       ["trailing shape", "(8,)", "rank 2"], MISMATCH, (), False),
    "trailing shape, rows beyond one exchange": (lambda c, r: c.all_reduce(_x(r, 8, 2048 if r == 1 else 4096)),
                                                 ["trailing shape", "(2048,)"], MISMATCH, (), False),
    "same bytes, other shape": (lambda c, r: c.all_reduce(_x(r, 8, 4) if r == 3 else _x(r, 4, 8)),
                                ["trailing shape", "(4,)", "rank 3"], MISMATCH, (), False),
    "all_reduce rows": (lambda c, r: c.all_reduce(_x(r, 3 if r == 0 else 2, 4)),
                        ["rows", "rank 0 passed 3"], MISMATCH, (), False),
    "sizes": (lambda c, r: c.all_gather_v(_x(r, r + 1, 4), [1, 2, 3, 5] if r == 2 else [1, 2, 3, 4]),
              ["sizes", "[1, 2, 3, 5]", "rank 2"], MISMATCH, (), False),
    "sizes with the same sum": (lambda c, r: c.reduce_scatter_v(_x(r, 6, 4), [2, 1, 2, 1] if r == 1 else [1, 2, 1, 2]),
                                ["sizes", "[2, 1, 2, 1]"], MISMATCH, (), False),
    "rows differ from dp_sizes[me]": (lambda c, r: c.gather_tokens(_x(r, 3 if r == 3 else 2, 4), [2, 2]),
                                      ["rank 3 rejected its arguments"], MISMATCH, (3,), False),
    "local error, two-exchange op": (lambda c, r: c.gather_tokens(_x(r, 2, 4).int() if r == 0 else _x(r, 2, 4), [2, 2]),
                                     ["rank 0 rejected its arguments"], (ValueError, TypeError), (0,), False),
    "op": (lambda c, r: c.all_reduce(_x(r, 4, 4)) if r == 0 else c.all_gather_v(_x(r, 1, 4), [1, 1, 1, 1]),
           ["op", "all_reduce", "all_gather_v"], MISMATCH, (), False),
    "partial": (lambda c, r: c.gather_tokens(_x(r, 2, 4), [2, 2], partial=r != 0),
                ["partial", "False", "True"], MISMATCH, (), False),
    "eps": (lambda c, r: _fused(c, r, eps=1e-5 if r == 1 else 1e-6),
            ["eps", "1e-05", "rank 1"], MISMATCH, (), False),
    "fusion on one rank": (lambda c, r: _fused(c, r) if r == 2 else c.gather_tokens(_x(r, 2, 4), [2, 2]),
                           ["fusion", "rank 2"], MISMATCH, (), False),
    "sizes tensor vs list": (lambda c, r: c.scatter_tokens(_x(r, 4, 4), _sizes([2, 2]) if r == 0 else [2, 2]),
                             ["kind of dp_sizes", "int32 tensor"], MISMATCH, (), False),
    "device sizes": (lambda c, r: c.scatter_tokens(_x(r, 6, 4), _sizes([3, 1] if r == 0 else [3, 2])),
                     ["dp_sizes", "[3, 1]", "[3, 2]"], MISMATCH, (), False),
    "capacity, gather": (lambda c, r: c.gather_tokens(_x(r, 4, 4), _sizes([2, 5])),
                         ["dp_sizes[1] = 5", "capacity"], (CapacityExceeded,), (), False),
    "capacity, scatter": (lambda c, r: c.scatter_tokens(_x(r, 4, 4), _sizes([3, 3])),
                          ["sum to 6", "holds only 4"], (CapacityExceeded,), (), False),
    "capacity differs": (lambda c, r: c.gather_tokens(_x(r, 8 if r < 2 else 4, 4), _sizes([2, 5])),
                         ["rank"], (HybridCommError,), (), False),
    "group": (lambda c, r: c.all_reduce(_x(r, 2, 4), group="attn_tp" if r == 1 else "world"),
              ["group", "'attn_tp'", "'world'"], MISMATCH, (), True),
    "unknown group on one rank": (lambda c, r: c.all_reduce(_x(r, 2, 4), group="tp" if r == 0 else "world"),
                                  ["rank 0 rejected its arguments"], MISMATCH, (0,), True),
}

_comms = {}


def _comm(validate):
    import hybridcomm as hc
    if validate not in _comms:
        _comms[validate] = hc.Communicator(hc.Layout(4, attn_tp=2, moe_tp=2), validate=validate)
    return _comms[validate]


def _next_calls_work(comm, rank) -> bool:
    total = comm.all_reduce(torch.full((3, 5), float(rank + 1)))
    sizes = [1, 0, 2, 1]
    gathered = comm.all_gather_v(torch.full((sizes[rank], 2), float(rank)), sizes)
    expected = torch.cat([torch.full((n, 2), float(i)) for i, n in enumerate(sizes)])
    return bool(torch.equal(total, torch.full((3, 5), 10.0)) and torch.equal(gathered, expected))


def _misuse(case, validate):
    import torch.distributed as dist
    comm, rank = _comm(validate), dist.get_rank()
    call = CASES[case][0]
    try:
        call(comm, rank)
        raised = None
    except Exception as e:
        raised = (type(e), str(e))
    return raised, _next_calls_work(comm, rank)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("validate", [True, False], ids=["validate", "no-validate"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_cross_rank_mismatch_raises_on_every_rank_and_the_next_call_works(pool, case, validate):
    _, words, types, local, validate_only = CASES[case]
    if validate_only and not validate:
        pytest.skip("needs validate=True: the ranks exchange over different groups (README: What is checked)")
    out = pool(4).run(_misuse, case, validate, timeout=60)
    for rank, (raised, next_ok) in enumerate(out):
        assert raised is not None, f"rank {rank} raised nothing"
        assert issubclass(raised[0], types), f"rank {rank}: {raised}"
        assert next_ok, f"rank {rank}: the next valid call failed"
    peers = [m for r, ((_, m), _) in enumerate(out) if r not in local]
    detected = [m for m in peers if all(w in m for w in words)]
    assert detected, f"no rank names {words}: {peers}"
    if validate:  # one exchange, one verdict: the same message on every rank
        assert peers == [peers[0]] * len(peers), peers


def _capacity_then_same_shapes_again():
    import torch.distributed as dist
    comm, rank = _comm(False), dist.get_rank()
    x = _x(rank, 4, 4)
    try:
        comm.gather_tokens(x, _sizes([2, 5]))
        return None
    except CapacityExceeded:
        pass
    out = comm.gather_tokens(x, _sizes([2, 3]))  # the same buffers, counts that fit
    return out.shape[0], bool(torch.isfinite(out[:5]).all())


@pytest.mark.timeout(120)
def test_capacity_overflow_then_the_same_call_with_counts_that_fit(pool):
    assert pool(4).run(_capacity_then_same_shapes_again, timeout=60) == [(8, True)] * 4


def _large_and_small_gathers():
    import torch.distributed as dist
    comm, rank = _comm(False), dist.get_rank()
    results = []
    for width in (1, 3000, 8192):  # rows of 4 B .. 32 KiB: inline with the header, or beyond it
        sizes = [3, 0, 5, 1]
        out = comm.all_gather_v(_x(rank, sizes[rank], width), sizes)
        expected = torch.cat([_x(i, n, width) for i, n in enumerate(sizes)])
        total = comm.all_reduce(_x(rank, 2, width))
        results.append(torch.equal(out, expected)
                       and torch.equal(total, sum(_x(i, 2, width) for i in range(4))))
    return results


@pytest.mark.timeout(120)
def test_gathers_with_headers_are_exact_inline_and_beyond(pool):
    assert pool(4).run(_large_and_small_gathers, timeout=60) == [[True] * 3] * 4


def test_argument_mismatch_is_a_value_error_and_a_hybridcomm_error():
    assert issubclass(ArgumentMismatch, ValueError) and issubclass(ArgumentMismatch, HybridCommError)


# -- lifetime ---------------------------------------------------------------------------------
CLOSED_CALLS = {
    "all_reduce": lambda c, r: c.all_reduce(_x(r, 2, 4)),
    "all_gather_v": lambda c, r: c.all_gather_v(_x(r, 1, 4), [1, 1]),
    "reduce_scatter_v": lambda c, r: c.reduce_scatter_v(_x(r, 2, 4), [1, 1]),
    "gather_tokens": lambda c, r: c.gather_tokens(_x(r, 1, 4), [1, 1]),
    "scatter_tokens": lambda c, r: c.scatter_tokens(_x(r, 2, 4), [1, 1]),
}


def _use_after_close(validate):
    import torch.distributed as dist
    import hybridcomm as hc
    rank = dist.get_rank()
    with hc.Communicator(hc.Layout(2), validate=validate) as comm:
        before = comm.all_reduce(torch.ones(2, 4))
    comm.close()  # a second close is harmless
    raised = {}
    for name, call in CLOSED_CALLS.items():
        try:
            call(comm, rank)
            raised[name] = None
        except hc.CommunicatorClosed as e:
            raised[name] = str(e)
    return bool(torch.equal(before, torch.full((2, 4), 2.0))), raised, "closed" in repr(comm)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("validate", [True, False])
def test_a_closed_communicator_raises_on_every_op(pool, validate):
    for worked, raised, shown in pool(2).run(_use_after_close, validate, timeout=60):
        assert worked and shown
        for name, message in raised.items():
            assert message is not None and name in message and "was closed" in message, (name, message)


def _closed_on_one_rank(validate):
    import torch.distributed as dist
    import hybridcomm as hc
    rank = dist.get_rank()
    comm = hc.Communicator(hc.Layout(2), validate=validate)
    if rank == 1:
        comm.close()
    try:
        comm.gather_tokens(_x(rank, 1, 4), [1, 1])
        return None
    except Exception as e:
        return type(e).__name__, str(e)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("validate", [True, False])
def test_a_rank_that_closed_early_makes_its_peers_raise_instead_of_wait(pool, validate):
    out = pool(2).run(_closed_on_one_rank, validate, timeout=60)
    assert out[1][0] == "CommunicatorClosed"
    assert out[0] is not None and "rank 1 rejected its arguments" in out[0][1]


def _workspace_released(n):
    import torch.distributed as dist
    import hybridcomm as hc
    comm = hc.Communicator(hc.Layout(n))
    nvlink = comm.backends["nvlink"]
    total = nvlink.workspace.total_bytes
    comm.all_reduce(torch.ones(8, 64, device=comm.device))
    torch.cuda.synchronize()
    dist.barrier()
    free_before = torch.cuda.mem_get_info()[0]
    comm.close()
    torch.cuda.synchronize()
    dist.barrier()  # peers unmap their views of this rank's buffer when they close too
    free_after = torch.cuda.mem_get_info()[0]
    return total, free_after - free_before, nvlink.handles, nvlink.workspace.args


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_close_releases_the_nvlink_workspace(pool):
    from conftest import gpu_count, sharing_gpus
    if gpu_count() < 2:
        pytest.skip(f"needs 2 CUDA GPUs, found {gpu_count()}")
    if sharing_gpus():  # the caching allocator keeps what close() drops there (shared_gpu.py)
        pytest.skip("--gpu-ranks: workspaces of ranks sharing a GPU are not symmetric memory")
    n = min(gpu_count(), 4)
    for total, freed, handles, args in pool(n, "cuda").run(_workspace_released, n, timeout=240):
        assert total > 0 and handles == {} and args == {}
        assert freed >= 0.9 * total, f"close() freed {freed} of the {total}-byte workspace"


# -- validate=True on every backend (world 2: runs on 2 GPUs, and on CPU) ----------------------
def _on(comm, t):
    return t.to(comm.device)


WORLD2_CASES = {
    "dtype": (lambda c, r: c.all_reduce(_on(c, _x(r, 2, 64, dtype=BF16 if r == 1 else F32))), ValueError),
    "trailing shape": (lambda c, r: c.all_gather_v(_on(c, _x(r, 1, 128 if r else 64)), [1, 1]), ValueError),
    "sizes": (lambda c, r: c.all_gather_v(_on(c, _x(r, [2, 3][r], 64)), [2, 3] if r == 1 else [2, 4]), ValueError),
    "all_reduce rows": (lambda c, r: c.all_reduce(_on(c, _x(r, 2 + r, 64))), ValueError),
    "capacity": (lambda c, r: c.gather_tokens(_on(c, _x(r, 4, 64)), _on(c, _sizes([2, 5]))), CapacityExceeded),
}


def _validated_world2(device):
    import torch.distributed as dist
    import hybridcomm as hc
    rank = dist.get_rank()
    comm = hc.Communicator(hc.Layout(2), device=device, validate=True)
    raised = {}
    for name, (call, _) in WORLD2_CASES.items():
        try:
            call(comm, rank)
            raised[name] = None
        except Exception as e:
            raised[name] = (type(e), str(e))
    x = torch.full((4, 64), float(rank + 1), device=comm.device)
    works = bool(torch.equal(comm.all_reduce(x).cpu(), torch.full((4, 64), 3.0)))
    comm.close()
    return raised, works


@pytest.mark.timeout(300)
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_validate_raises_the_same_error_on_every_rank_of_every_backend(pool, device):
    from conftest import gpu_count
    if device == "cuda" and gpu_count() < 2:
        pytest.skip(f"needs 2 CUDA GPUs, found {gpu_count()}")
    (mine, works0), (theirs, works1) = pool(2, device).run(_validated_world2, device, timeout=240)
    assert works0 and works1
    for name, (_, kind) in WORLD2_CASES.items():
        assert mine[name] is not None and issubclass(mine[name][0], kind), (name, mine[name])
        assert mine[name] == theirs[name], name
