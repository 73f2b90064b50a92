"""GPU tests of the Lamport-protocol kernels (csrc/lamport.cuh) on 2, 4 or 8 GPUs
(conftest.gpu_world; skipped with fewer).

- every Lamport op forced through a table, eager, against the oracle: uneven counts with
  zeros, device-side counts, fp32 / fp16 / bf16, random data and data carrying the reserved
  pattern (the sentinel's bits);
- one CUDA graph that interleaves Lamport and LL calls on the same group, replayed 1000 times
  with random device-side counts (the slot rotation, the re-fill extents and the group call
  counter all advance inside the graph), with and without programmatic dependent launch.

Gathers are compared bit for bit. Sums too, except where the oracle's result is NaN: torch and
our kernels round a NaN sum to 16 bits with different payloads (0x7FC0 vs 0x7FFF), which is not
what these tests are about, so there only the NaN positions must agree.
"""

import random

import pytest
import torch

from conftest import needs_gpus
from test_gpu import MAIN_LAYOUTS, MIXED_LAYOUT, WORLD
from hybridcomm.check import Case, call_op, communicator, digest, expected, member_input

pytestmark = [pytest.mark.gpu, needs_gpus(2)]

LAMPORT = "one_shot_lamport"


def reduces(case: Case) -> bool:
    """Does the op sum (else it only moves bits)? gather_tokens sums over attn-TP partials."""
    if case.op == "gather_tokens":
        return case.partial and case.layout.attn_tp > 1
    return case.op in ("all_reduce", "reduce_scatter_v", "scatter_tokens")


def same_bits_group(case: Case) -> str | None:
    """The group whose members all hold the same result (None: each holds its own)."""
    return {"all_reduce": case.group, "all_gather_v": case.group, "gather_tokens": "world",
            "scatter_tokens": "attn_tp"}.get(case.op)


def mismatch(got: torch.Tensor, want: torch.Tensor, reduces: bool) -> str:
    """'' when equal bit for bit (NaN positions only, where a sum is NaN), else what differs."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"got {tuple(got.shape)} {got.dtype}, expected {tuple(want.shape)} {want.dtype}"
    if reduces:
        got_nan, want_nan = torch.isnan(got), torch.isnan(want)
        if not torch.equal(got_nan, want_nan):
            return f"NaN at {int((got_nan != want_nan).sum())} other positions"
        got, want = got[~got_nan], want[~want_nan]
    bad = int((got.contiguous().view(-1).view(torch.uint8) != want.contiguous().view(-1).view(torch.uint8)).sum())
    return f"{bad} bytes differ" if bad else ""


# -- eager: every op, forced to Lamport -------------------------------------------------------------
def _groups(layout):
    return [g for g in ("world", "attn_tp", "attn_dp", "moe_tp", "moe_ep") if len(layout.group_ranks(g, 0)) > 1]


def lamport_cases(seed: int) -> list[Case]:
    rng = random.Random(seed)
    cases = []
    for layout in MAIN_LAYOUTS + [MIXED_LAYOUT]:
        for group in _groups(layout):
            n = len(layout.group_ranks(group, 0))
            for dtype in ("float32", "bfloat16", "float16"):
                for data in ("randn", "reserved"):
                    for device_sizes in (False, True):
                        base = dict(layout=layout, group=group, dtype=dtype, data=data, row_shape=(64,),
                                    device_sizes=device_sizes, seed=rng.randrange(1 << 30))
                        uneven = tuple(rng.randint(0, 5) for _ in range(n))
                        uneven = (0,) + uneven[1:] if rng.random() < 0.5 else uneven[:-1] + (0,)
                        if not device_sizes:
                            cases.append(Case("all_reduce", sizes=(rng.randint(1, 6),), **base))
                        cases.append(Case("all_gather_v", sizes=uneven, **base))
                        cases.append(Case("reduce_scatter_v", sizes=uneven[::-1], **base))
                        cases.append(Case("all_gather_v", sizes=(0,) * n, **base))  # nothing at all
        dp = layout.attn_dp
        for dtype in ("float32", "bfloat16", "float16"):
            for data in ("randn", "reserved"):
                for device_sizes in (False, True):
                    base = dict(layout=layout, dtype=dtype, data=data, row_shape=(64,), device_sizes=device_sizes,
                                seed=rng.randrange(1 << 30))
                    uneven = tuple(rng.randint(0, 5) for _ in range(dp))
                    uneven = uneven[:-1] + (0,) if dp > 1 and rng.random() < 0.5 else uneven
                    for partial in (True, False):
                        cases.append(Case("gather_tokens", sizes=uneven, partial=partial, **base))
                    cases.append(Case("scatter_tokens", sizes=uneven[::-1], **base))
        big_rows = tuple(rng.randint(0, 64) for _ in range(dp))
        for op in ("gather_tokens", "scatter_tokens"):
            cases.append(Case(op, layout, big_rows, row_shape=(4096,), dtype="bfloat16", data="reserved", seed=5))
        for group in _groups(layout):
            n = len(layout.group_ranks(group, 0))
            # Rows of 8 KB, hundreds of units per thread block: many blocks, and re-fills of
            # hundreds of KB between calls of very different sizes.
            big = dict(layout=layout, group=group, dtype="bfloat16", data="reserved", row_shape=(4096,))
            cases.append(Case("all_reduce", sizes=(96,), seed=1, **big))
            cases.append(Case("all_gather_v", sizes=tuple(rng.randint(0, 64) for _ in range(n)), seed=2, **big))
            cases.append(Case("reduce_scatter_v", sizes=tuple(rng.randint(0, 64) for _ in range(n)), seed=3, **big))
            cases.append(Case("all_reduce", sizes=(1,), seed=4, **big))
    return cases


def _run_lamport_cases(cases: list[Case], pdl: bool) -> list[tuple[str, str, str]]:
    """Worker: (case, mismatch, digest) per case, every op forced onto the Lamport kernels."""
    import hybridcomm.kernels as kernels

    kernels.poison_outputs = True
    results = []
    for case in cases:
        comm = communicator(case.layout, "auto", "lamport")
        comm.backends["nvlink"].pdl = pdl
        got = call_op(comm, case, comm.device)
        comm.check_errors()
        want = expected(case, comm.rank, comm.device)
        results.append((case.describe(), mismatch(got, want, reduces(case)), digest(got)))
    return results


@pytest.mark.timeout(900)
@pytest.mark.parametrize("pdl", [True, False], ids=["pdl", "no_pdl"])
def test_lamport_ops_match_the_oracle_bit_for_bit(pool, pdl):
    cases = lamport_cases(seed=11)
    per_rank = pool(WORLD, "cuda").run(_run_lamport_cases, cases, pdl, timeout=600)
    failures = [f"rank {r}: {c}: {d}" for r, outs in enumerate(per_rank) for c, d, _ in outs if d]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:30])
    for i, case in enumerate(cases):  # ranks that hold the same value hold the same bits
        if same_bits_group(case) is None:
            continue
        for r in range(WORLD):
            members = case.layout.group_ranks(same_bits_group(case), r)
            assert len({per_rank[m][i][2] for m in members}) == 1, f"{case.describe()}: ranks {members} differ"


# -- graph: Lamport and LL calls interleaved on one group, replayed ------------------------------------
# (op, algorithm) in capture order: Lamport calls before, between and after LL ones, so the
# Lamport slot advances across LL calls and the group call counter across both. The token
# transitions run on the world group only.
SEQUENCE = [("all_gather_v", LAMPORT), ("all_gather_v", "one_shot"), ("reduce_scatter_v", LAMPORT),
            ("all_reduce", LAMPORT), ("gather_tokens", LAMPORT), ("reduce_scatter_v", "one_shot"),
            ("scatter_tokens", LAMPORT), ("all_reduce", "one_shot"), ("gather_tokens", "one_shot"),
            ("all_gather_v", LAMPORT), ("scatter_tokens", "two_shot"), ("all_reduce", LAMPORT)]
TOKEN_OPS = ("gather_tokens", "scatter_tokens")


def _interleaved_replays(layout, group: str, replays: int, capacity: int, pdl: bool, seed: int) -> dict:
    """Worker: capture SEQUENCE once with device-side counts, replay it with random counts
    (zeros included) and fresh data (random, or carrying the reserved pattern), compare every
    output of every replay with the oracle."""
    import torch.distributed as dist

    from hybridcomm.arguments import parse_sizes

    comm = communicator(layout)
    nvlink, g, device, rank = comm.backends["nvlink"], comm.groups[group], comm.device, comm.rank
    nvlink.pdl = pdl
    n, dp, row_shape, dtype = g.size, layout.attn_dp, (256,), torch.bfloat16
    sequence = [(op, alg) for op, alg in SEQUENCE if group == "world" or op not in TOKEN_OPS]
    input_rows = {"all_gather_v": capacity, "reduce_scatter_v": n * capacity, "all_reduce": capacity,
                  "gather_tokens": capacity, "scatter_tokens": dp * capacity}
    inputs = {op: torch.zeros((rows,) + row_shape, dtype=dtype, device=device) for op, rows in input_rows.items()}
    counts_dev = {"group": torch.full((n,), capacity, dtype=torch.int32, device=device),
                  "dp": torch.full((dp,), capacity, dtype=torch.int32, device=device)}
    sizes = parse_sizes(counts_dev["group"], n, device, "sizes")
    dp_sizes = parse_sizes(counts_dev["dp"], dp, device, "dp_sizes")

    def call(op, algorithm):
        x = inputs[op]
        if op == "all_reduce":
            return nvlink.all_reduce(x, g, algorithm)
        if op == "gather_tokens":
            return nvlink.gather_tokens(x, dp_sizes, True, None, algorithm)
        if op == "scatter_tokens":
            return nvlink.scatter_tokens(x, dp_sizes, algorithm)
        return getattr(nvlink, op)(x, sizes, g, algorithm)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for op, algorithm in sequence:
            call(op, algorithm)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [call(op, algorithm) for op, algorithm in sequence]
    rng = random.Random(seed)
    failures, digests = [], []
    for it in range(replays):
        counts = {"group": [rng.randint(0, capacity) for _ in range(n)],
                  "dp": [rng.randint(0, capacity) for _ in range(dp)]}
        if it % 3 == 0:
            counts["group"][rng.randrange(n)] = 0
            counts["dp"][rng.randrange(dp)] = 0
        data = "reserved" if it % 2 else "randn"
        cases = {}
        for op in inputs:
            op_sizes = (rng.randint(1, capacity),) if op == "all_reduce" else tuple(
                counts["dp" if op in TOKEN_OPS else "group"])
            cases[op] = Case(op, layout, op_sizes, group, row_shape, "bfloat16", data, device_sizes=True,
                             seed=seed * 7919 + it)
        for op, x in inputs.items():
            x.fill_(1e4)  # rows beyond the counts must never be read
            inp = member_input(cases[op], rank, device)
            x[: inp.shape[0]] = inp
        for key, t in counts_dev.items():
            t.copy_(torch.tensor(counts[key], dtype=torch.int32))
        for o in outs:
            o.fill_(float("nan"))
        graph.replay()
        replay_digests = []
        for (op, algorithm), out in zip(sequence, outs):
            want = expected(cases[op], rank, device)
            got = out[: want.shape[0]]
            detail = mismatch(got, want, reduces(cases[op]))
            if detail:
                failures.append(f"replay {it} counts {counts} {op}/{algorithm}: {detail}")
            # Same bits on every member for what every member holds in full (scatter_tokens:
            # the same on attn-TP peers only, checked by the eager test).
            replay_digests.append(digest(got) if op in ("all_reduce", "all_gather_v", "gather_tokens") else "")
        digests.append(replay_digests)
    torch.cuda.synchronize()
    comm.check_errors()
    del graph
    dist.barrier()
    return {"failures": failures[:10], "mismatches": len(failures), "digests": digests}


def _replay_groups():
    for layout in MAIN_LAYOUTS:
        for group in ["world"] + [g for g in ("attn_tp", "attn_dp") if 1 < len(layout.group_ranks(g, 0)) < WORLD]:
            yield layout, group


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("pdl,replays", [(True, 1000), (False, 200)], ids=["pdl", "no_pdl"])
def test_graph_interleaving_lamport_and_ll_calls_replays_with_random_device_side_counts(pool, pdl, replays):
    for layout, group in _replay_groups():
        per_rank = pool(WORLD, "cuda").run(_interleaved_replays, layout, group, replays, 6, pdl, 5, timeout=1200)
        what = f"{layout.name} {group} pdl={pdl}"
        for rank, result in enumerate(per_rank):
            assert result["mismatches"] == 0, f"{what} rank {rank}: {result['failures']}"
        for r in range(WORLD):  # gathers and all-reduces: same bits on every member, every replay
            members = layout.group_ranks(group, r)
            for it in range(replays):
                assert len({tuple(per_rank[m]["digests"][it]) for m in members}) == 1, f"{what}: replay {it}"


# -- after ranks disagree: no stale data ---------------------------------------------------------------
def _calls_after_a_width_mismatch(calls: int) -> dict:
    """Worker: one Lamport all_gather_v in which rank 1 passes rows half as wide as its peers'
    (its peers write twice the units it expects, beyond its normal re-fill), then `calls` more
    with the full width, cycling through every slot several times."""
    import torch.distributed as dist

    import hybridcomm as hc

    world, rank = dist.get_world_size(), dist.get_rank()
    layout = hc.Layout(world)
    comm = communicator(layout, "auto", "lamport")
    x = torch.randn(8, 32 if rank == 1 else 64, device="cuda")
    comm.all_gather_v(x, [8] * world)
    try:
        comm.check_errors()
        raised = None
    except hc.ArgumentMismatch as e:
        raised = str(e)
    failures = []
    for it in range(calls):
        case = Case("all_gather_v", layout, (8,) * world, row_shape=(64,), data="randn", seed=100 + it)
        got = comm.all_gather_v(member_input(case, rank, comm.device), list(case.sizes))
        comm.check_errors()
        detail = mismatch(got, expected(case, rank, comm.device), reduces=False)
        if detail:
            failures.append(f"call {it}: {detail}")
    return {"raised": raised, "failures": failures}


@pytest.mark.timeout(300)
def test_lamport_calls_after_an_argument_mismatch_read_no_stale_data(pool):
    for rank, result in enumerate(pool(WORLD, "cuda").run(_calls_after_a_width_mismatch, 9, timeout=120)):
        assert result["raised"] is not None, f"rank {rank}: no ArgumentMismatch"
        assert not result["failures"], f"rank {rank}: {result['failures']}"
