"""GPU tests of the composed "two_step" transitions (two_step.py) on our kernels: forced at
every size on every layout of the world (bit for bit with the oracle, which is the reference's
fp32 group-order sum; host and device-side counts, partial and replicated gathers, uneven
counts with zeros, rows up to 4096 wide), one CUDA graph replayed with new device-side counts,
the selection table reaching it at a large size (against the reference backend's bits), and
own counts (hc.Counts of a device count: its all_gather_v step exchanges the chunk counts in
its kernel; test_gpu_counts.py's checks, eager and in a graph with gather + scatter). World 2, 4
or 8 (conftest.gpu_world); skipped with fewer than 2. tests/test_two_step.py runs the same
composition on CPU."""

import pytest

from conftest import gpu_world, needs_gpus
from hybridcomm import Layout, algorithms
from hybridcomm.check import Case, cases_for_layout, check_poisoned_cases, failures_of, replay_check

pytestmark = [pytest.mark.gpu, needs_gpus(2)]

WORLD = gpu_world()
TP_LAYOUTS = [lay for lay in Layout.all_for_world(WORLD) if lay.moe_tp == 1]  # attn_tp 1 .. WORLD
TRANSITIONS = ("gather_tokens", "scatter_tokens")
HIDDEN = 4096


def _run(pool, cases, table):
    per_rank = pool(WORLD, "cuda").run(check_poisoned_cases, cases, "auto", "sums", table, timeout=600)
    failures = failures_of(cases, per_rank)
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:30])


def _large(lay: Layout, seed: int) -> list[Case]:
    """Rows of 8 KB, uneven (a zero where there are several DP groups): the steps' Lamport sizes."""
    counts = tuple((300, 0, 129, 17)[d % 4] for d in range(lay.attn_dp)) if lay.attn_dp > 1 else (300,)
    return [Case(op, lay, counts, row_shape=(HIDDEN,), dtype="bfloat16", data="randn", partial=partial,
                 device_sizes=dev, seed=seed + i)
            for i, (op, partial, dev) in enumerate([("gather_tokens", True, False), ("gather_tokens", False, False),
                                                    ("scatter_tokens", True, False), ("gather_tokens", True, True),
                                                    ("scatter_tokens", True, True)])]


@pytest.mark.timeout(900)
def test_two_step_forced_matches_the_oracle_on_every_layout(pool):
    cases = []
    for i, lay in enumerate(Layout.all_for_world(WORLD)):
        for data, dtypes in (("randn", ("bfloat16", "float32")), ("reserved", ("float16",))):
            cases += [c for c in cases_for_layout(lay, dtypes=dtypes, data=data, row_shape=(64,),
                                                  device_sizes=(False, True), seed=30 + i)
                      if c.op in TRANSITIONS and not c.fused]
        if lay.moe_tp == 1:
            cases += _large(lay, 60 + 10 * i)
    _run(pool, cases, "two_step")


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("layout", TP_LAYOUTS, ids=lambda lay: lay.name)
def test_one_graph_replayed_with_new_device_side_counts(pool, layout):
    for op, partial in (("gather_tokens", True), ("gather_tokens", False), ("scatter_tokens", True)):
        template = Case(op, layout, (0,) * layout.attn_dp, row_shape=(256,), dtype="bfloat16", data="randn",
                        partial=partial, device_sizes=True)
        per_rank = pool(WORLD, "cuda").run(replay_check, template, 200, 6, "two_step", 11, timeout=900)
        what = f"{op} partial={partial} on {layout.name}"
        for rank, result in enumerate(per_rank):
            assert result["mismatches"] == 0, f"{what} rank {rank}: {result['failures']}"
        same_value = "world" if op == "gather_tokens" else "attn_tp"
        for members in {layout.group_ranks(same_value, r) for r in range(WORLD)}:
            for it in range(200):
                assert len({per_rank[r]["digests"][it] for r in members}) == 1, f"{what}: replay {it}"


def _selected_and_reference(cases, table: str = "auto"):
    """Worker: each case on `table` (its choice) and on the reference backend."""
    from hybridcomm.check import call_op, communicator, digest

    out = []
    for case in cases:
        comm = communicator(case.layout, table=table)
        got = call_op(comm, case, comm.device)
        choice = comm.last_choice
        want = call_op(communicator(case.layout, "reference"), case, comm.device)
        out.append(((choice.backend, choice.algorithm), digest(got), digest(want)))
    return out


def _two_step_rule(op: str, layout: Layout) -> tuple[int, int]:
    """(exclusive lower, inclusive upper) message bytes where the built-in table runs two_step
    on `layout` (its rules for that layout where it has them: algorithms.py)."""
    rules = algorithms.TABLE[algorithms.rules_key(algorithms.TABLE, op, layout.attention_name)]
    i = next(i for i, r in enumerate(rules) if r.algorithm == "two_step")
    return (rules[i - 1].max_bytes if i else 0), rules[i].max_bytes


@pytest.mark.timeout(600)
def test_the_table_runs_two_step_at_large_sizes_with_the_reference_s_bits(pool):
    cases = []
    for lay in TP_LAYOUTS:
        if lay.attn_tp == 1:
            continue
        for op in TRANSITIONS:
            low, high = _two_step_rule(op, lay)
            # Twice the rule's lower limit (4 MiB and less per peer: the steps' Lamport kernels,
            # not NCCL, whose sums are not the reference's bits), uneven over DP groups.
            rows = min(2 * low, high) // (HIDDEN * 2) // lay.attn_dp
            counts = tuple(rows - 3 * d for d in range(lay.attn_dp))
            assert low < sum(counts) * HIDDEN * 2 <= high
            cases.append(Case(op, lay, counts, row_shape=(HIDDEN,), dtype="bfloat16", data="randn",
                              seed=len(cases)))
    per_rank = pool(WORLD, "cuda").run(_selected_and_reference, cases, timeout=300)
    for rank, outcomes in enumerate(per_rank):
        for case, (choice, got, want) in zip(cases, outcomes):
            assert choice == ("nvlink", "two_step"), (rank, case.describe(), choice)
            assert got == want, f"rank {rank}: {case.describe()}: bits differ from the reference backend"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("layout", TP_LAYOUTS, ids=lambda lay: lay.name)
def test_own_counts_are_exchanged_in_the_kernel_eager_and_in_a_graph(pool, layout):
    from test_gpu_counts import _eager, _replays

    per_rank = pool(WORLD, "cuda").run(_eager, layout, "two_step", 13, timeout=600)
    failures = [f"rank {r}: {f}" for r, fs in enumerate(per_rank) for f in fs]
    assert not failures, "\n".join(failures[:20])
    for partial in (True, False):
        variant = ("gather_tokens", "world", partial, False)
        for rank, result in enumerate(pool(WORLD, "cuda").run(_replays, layout, variant, "two_step", 100, 7,
                                                             timeout=600)):
            assert result["mismatches"] == 0, f"partial={partial} rank {rank}: {result['failures']}"

