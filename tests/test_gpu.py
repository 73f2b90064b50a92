"""GPU tests: our kernels against the oracle on the GPUs there are: world 8, 4 or 2
(conftest.gpu_world; skipped with fewer than 2).

Run by scripts/gpu_check.sh on the GPU machine. Sums are compared bit for bit (our kernels
reduce in fp32 in group order, like the reference); the fused RMSNorm output within one
bf16 rounding; NCCL within tolerance. Outputs are poisoned with NaN before every op.
"""

import time

import pytest
import torch

from conftest import attention_layouts, gpu_world, needs_gpus, needs_nccl
from hybridcomm import Layout
from hybridcomm.check import Case, cases_for_layout, check_poisoned_cases, failures_of, replay_check

pytestmark = [pytest.mark.gpu, needs_gpus(2)]

WORLD = gpu_world()
# DP2xTP2, DP4, TP4 on 4 GPUs; DP2, TP2 on 2; DP4xTP2, DP2xTP4, DP8, TP8 on 8.
MAIN_LAYOUTS = attention_layouts(WORLD)
MIXED_LAYOUT = Layout(WORLD, attn_tp=2, moe_tp=2)


def _run(pool, cases, backend="auto", exact="sums", table="auto", worker=check_poisoned_cases):
    per_rank = pool(WORLD, "cuda").run(worker, cases, backend, exact, table, timeout=600)
    failures = failures_of(cases, per_rank)
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:30])


def _cases(layouts, seed):
    cases = []
    for i, lay in enumerate(layouts):
        cases += cases_for_layout(lay, dtypes=("bfloat16", "float32"), data="randn", row_shape=(64,),
                                  device_sizes=(False, True), seed=seed + i)
        cases += cases_for_layout(lay, dtypes=("float16",), data="int", row_shape=(4, 8), seed=seed + 50 + i)
    return cases


@pytest.mark.timeout(900)
def test_every_op_and_group_of_every_layout_of_the_world_matches_the_oracle(pool):
    _run(pool, _cases(Layout.all_for_world(WORLD), seed=10))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("table", ["one_shot", "two_shot", "bulk", "lamport"])
def test_each_algorithm_forced_matches_the_oracle(pool, table):
    _run(pool, _cases(MAIN_LAYOUTS + [MIXED_LAYOUT], seed=20), table=table)


@pytest.mark.timeout(900)
def test_large_messages_cross_the_table_thresholds(pool):
    cases = []
    for lay in MAIN_LAYOUTS:
        # Sizes that select each algorithm of the table (rows of 8 KB) but stay below the sizes
        # it hands to NCCL (NCCL is not bit-exact): all_reduce 800 KB LL two-shot, 2.4 MB bulk.
        for op, sizes in [("all_reduce", (100,)), ("all_reduce", (300,)), ("gather_tokens", (40,) * lay.attn_dp),
                          ("gather_tokens", (150,) * lay.attn_dp), ("scatter_tokens", (40,) * lay.attn_dp),
                          ("scatter_tokens", (100,) * lay.attn_dp)]:
            cases.append(Case(op, lay, sizes, row_shape=(4096,), dtype="bfloat16", data="randn", seed=len(cases)))
        cases.append(Case("gather_tokens", lay, (150,) * lay.attn_dp, row_shape=(4096,), dtype="bfloat16",
                          data="randn", fused=True, seed=99))
    _run(pool, cases)


@needs_nccl()
@pytest.mark.timeout(900)
def test_nccl_backend_matches_the_oracle_within_tolerance(pool):
    cases = []
    for i, lay in enumerate(MAIN_LAYOUTS):
        cases += cases_for_layout(lay, dtypes=("bfloat16",), data="randn", row_shape=(64,), seed=30 + i)
    _run(pool, cases, backend="nccl", exact="none")


def _closing_check(cases, backend, exact, table):
    """check_poisoned_cases, then the communicators of `backend` closed: nccl_symm's registered
    windows are released on every rank at this same point, not at process exit."""
    import hybridcomm.check as check

    outcomes = check_poisoned_cases(cases, backend, exact, table)
    torch.cuda.synchronize()
    for key in [k for k in check._communicators if k[1] == backend]:
        check._communicators.pop(key).close()
    return outcomes


@needs_nccl()
@pytest.mark.timeout(900)
def test_nccl_symm_backend_matches_the_oracle_within_tolerance(pool):
    """The token transitions on NCCL symmetric windows (the other ops run as on nccl)."""
    cases = []
    for i, lay in enumerate(MAIN_LAYOUTS):
        cases += [c for c in cases_for_layout(lay, dtypes=("bfloat16",), data="randn", row_shape=(64,), seed=40 + i)
                  if c.op in ("gather_tokens", "scatter_tokens")]
    _run(pool, cases, backend="nccl_symm", exact="none", worker=_closing_check)


REPLAY_OPS = [
    ("all_gather_v", "world", True, False), ("all_gather_v", "attn_tp", True, False),
    ("reduce_scatter_v", "world", True, False), ("reduce_scatter_v", "attn_dp", True, False),
    ("gather_tokens", "world", True, False), ("gather_tokens", "world", False, False),
    ("gather_tokens", "world", True, True), ("scatter_tokens", "world", True, False),
]


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("layout", MAIN_LAYOUTS, ids=lambda lay: lay.name)
def test_one_graph_replayed_1000_times_with_random_device_side_sizes(pool, layout):
    for op, group, partial, fused in REPLAY_OPS:
        if group != "world" and len(layout.group_ranks(group, 0)) == 1:
            continue
        count = layout.attn_dp if op.endswith("tokens") else len(layout.group_ranks(group, 0))
        template = Case(op, layout, (0,) * count, group, row_shape=(256,), dtype="bfloat16", data="randn",
                        partial=partial, fused=fused, device_sizes=True)
        # The fused gather's tables: LL (auto) and Lamport (fused_lamport, where one hop reaches every rank).
        for table in (("auto", "two_shot") if op in ("gather_tokens", "scatter_tokens") and partial and not fused
                      else ("auto", "lamport") if fused else ("auto",)):
            replays = 1000 if table == "auto" else 200
            per_rank = pool(WORLD, "cuda").run(replay_check, template, replays, 6, table, 7, timeout=900)
            what = f"{op} {group} partial={partial} fused={fused} table={table}"
            for rank, result in enumerate(per_rank):
                assert result["mismatches"] == 0, f"{what} rank {rank}: {result['failures']}"
            # Ranks that hold the same value hold the same bits, on every replay.
            same_value = {"all_gather_v": group, "gather_tokens": "world", "scatter_tokens": "attn_tp"}
            classes = {layout.group_ranks(same_value[op], r) for r in range(WORLD)} if op in same_value else set()
            for members in classes:
                for it in range(replays):
                    assert len({per_rank[r]["digests"][it] for r in members}) == 1, f"{what}: replay {it}"


def _skip_a_call(timeout_s, table="auto"):
    import torch.distributed as dist
    import hybridcomm as hc
    from hybridcomm.algorithms import NAMED_TABLES

    last = dist.get_world_size() - 1
    comm = hc.Communicator(hc.Layout(dist.get_world_size()), timeout_s=timeout_s, table=NAMED_TABLES[table])
    x = torch.ones(256, device="cuda")
    comm.all_reduce(x)  # everyone
    comm.check_errors()
    start = time.monotonic()
    if dist.get_rank() != last:  # the last rank skips the second call
        try:
            comm.all_reduce(x)
            comm.check_errors()
            return ("no error", time.monotonic() - start)
        except hc.PeerTimeout as e:
            return (str(e), time.monotonic() - start, e.peer, e.op, e.group)
    return None


@pytest.mark.timeout(300)
@pytest.mark.parametrize("table", ["one_shot", "lamport"])
def test_a_rank_that_skips_a_call_makes_its_peers_raise_peer_timeout_naming_it(pool, table):
    timeout_s = 0.5
    results = pool(WORLD, "cuda").run(_skip_a_call, timeout_s, table, timeout=120)
    last = WORLD - 1
    for rank in range(last):
        message, elapsed, peer, op, group = results[rank]
        assert (peer, op, group) == (last, "all_reduce", "world"), message
        assert f"peer rank {last}" in message
        # A deadline, not a speed claim: the kernel must give up, not spin forever.
        assert elapsed < timeout_s + 30, f"rank {rank} took {elapsed:.1f} s"


def _overfull_device_sizes():
    import hybridcomm as hc

    import torch.distributed as dist

    world = dist.get_world_size()
    comm = hc.Communicator(hc.Layout(world))
    x = torch.ones(4, 128, device="cuda")
    # 9 > 4 rows of the input, and the total beyond the output's 4 * world rows
    sizes = torch.tensor([4, 9] + [4] * (world - 2), dtype=torch.int32, device="cuda")
    comm.all_gather_v(x, sizes)
    try:
        comm.check_errors()
        first = None
    except hc.CapacityExceeded as e:
        first = str(e)
    # The kernels stayed in step: the next call works.
    ok = comm.all_gather_v(x, [4] * world)
    comm.check_errors()
    return first, bool((ok == 1).all())


@pytest.mark.timeout(300)
def test_device_sizes_beyond_capacity_raise_and_leave_the_communicator_usable(pool):
    for first, ok in pool(WORLD, "cuda").run(_overfull_device_sizes, timeout=120):
        assert first is not None and "more rows than the buffers" in first
        assert ok
