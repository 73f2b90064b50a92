"""GPU tests of the pipelined algorithms on the chunked protocol (csrc/chunked.cuh): the
two-shot all_reduce (csrc/pipelined_all_reduce.cu) and the one-shots of all_gather_v and
reduce_scatter_v (csrc/pipelined_<op>.cu). Skipped without 2 GPUs; world 4 where 4 exist, else 2.

Bit for bit against the oracle (fp32 sums in group order) on random data, at sizes and
(chunk, blocks) settings that give empty shards, partial last chunks, odd chunk counts, several
chunks per block and chunk sizes the kernel must raise; every dtype; one CUDA graph replayed
200 times that interleaves it with the other all_reduce algorithms on the same group (so the
monotonic per-chunk flags and the slots stay in step with the LL / bulk / Lamport calls);
messages beyond the workspace (the launcher cuts them into several calls);
a peer that skips a call (PeerTimeout); ranks that pass different chunk sizes (ArgumentMismatch).
all_gather_v / reduce_scatter_v: uneven counts with zeros, host- and device-side, every dtype, reserved NaNs, a
whole area per member, two (chunk, blocks) settings; one graph replayed 100 times with random
device-side counts.
"""

import random

import pytest
import torch

from conftest import gpu_world, needs_gpus
from test_gpu import _skip_a_call

pytestmark = [pytest.mark.gpu, needs_gpus(2)]

WORLD = gpu_world()
KiB, MiB = 1 << 10, 1 << 20


def _case(nbytes: int, dtype: str, seed: int, data: str = "randn"):
    """An all_reduce Case of `nbytes` over the world (rows of 16 bytes)."""
    from hybridcomm import Layout
    from hybridcomm.check import DTYPES, Case

    width = 16 // DTYPES[dtype].itemsize
    return Case("all_reduce", Layout(WORLD), (nbytes // 16,), "world", row_shape=(width,), dtype=dtype, data=data,
                seed=seed)


# (message bytes, chunk bytes, blocks): what each exercises, with world 2 / 4.
SETTINGS = [
    (16, 1 * KiB, 8),                      # one unit: every shard but the last is empty
    (48, 1 * KiB, 8),                      # shards shorter than a chunk
    (3 * 2 * KiB * WORLD + 80, 1 * KiB, 2),  # 7 chunks per shard, partial last one, 2 blocks: 4 and 3 each
    (1 * MiB + 16, 1 * KiB, 5),            # hundreds of chunks per shard, many steps per block
    (1 * MiB, 8 * KiB, 64),                # more blocks than chunks
    (4 * MiB - 16 * WORLD, 64 * KiB, 32),  # uneven shards, the last chunk one unit short
    (WORLD * 4 * MiB, 1 * KiB, 24),        # a full area per peer; 4096 chunks of 1 KiB: the flag limit
    (WORLD * 8 * MiB + 48, 64 * KiB, 32),  # beyond the workspace: two full calls and one of 3 units
]


def _pipelined(workspace_bytes=None, timeout_s=10.0):
    import hybridcomm as hc
    from hybridcomm.algorithms import NAMED_TABLES

    return hc.Communicator(hc.Layout(WORLD), table=NAMED_TABLES["pipelined"], workspace_bytes=workspace_bytes,
                           timeout_s=timeout_s)


def _check_settings(settings, dtypes, workspace_bytes=None, data="randn"):
    import hybridcomm.kernels as kernels
    from hybridcomm.check import run_case
    from hybridcomm.pipeline import PipelineParams

    kernels.poison_outputs = True
    comm = _pipelined(workspace_bytes)
    failures = []
    for i, (nbytes, chunk, blocks) in enumerate(settings):
        comm.backends["nvlink"].pipeline = PipelineParams(chunk, blocks)
        for k, dtype in enumerate(dtypes):
            case = _case(nbytes, dtype, seed=100 * i + k, data=data)  # the same on every rank
            outcome = run_case(comm, case, comm.device, "all")
            if comm.last_choice.algorithm != "two_shot_pipelined":
                failures.append(f"{case.describe()}: ran {comm.last_choice}")
            if not outcome.ok:
                failures.append(f"{case.describe()} chunk {chunk} blocks {blocks}: {outcome.detail}")
    comm.check_errors()
    comm.close()
    return failures


def _assert_none(per_rank):
    failures = [f"rank {r}: {f}" for r, fs in enumerate(per_rank) for f in fs]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:20])


@pytest.mark.timeout(600)
def test_every_dtype_bit_for_bit_with_partial_and_odd_chunks(pool):
    _assert_none(pool(WORLD, "cuda").run(_check_settings, SETTINGS, ("bfloat16", "float16", "float32"),
                                         timeout=500))


@pytest.mark.timeout(600)
def test_reserved_nans_and_a_chunk_size_the_kernel_must_raise(pool):
    # 8 MiB areas: a shard of 6 MiB in 1 KiB chunks would need 6144 > 4096 flags: raised to 2 KiB.
    settings = [(WORLD * 6 * MiB, 1 * KiB, 32), (3 * KiB * WORLD + 16, 1 * KiB, 3)]
    _assert_none(pool(WORLD, "cuda").run(_check_settings, settings, ("bfloat16", "float32"), 8 * MiB,
                                         timeout=500))
    _assert_none(pool(WORLD, "cuda").run(_check_settings, settings[1:], ("float16",), None, "reserved",
                                         timeout=500))


def _different_blocks_per_rank():
    """Ranks may run different block counts (the protocol is per chunk, not per block)."""
    import torch.distributed as dist

    from hybridcomm.check import expected, member_input
    from hybridcomm.pipeline import PipelineParams

    comm = _pipelined()
    comm.backends["nvlink"].pipeline = PipelineParams(2 * KiB, 3 + 4 * dist.get_rank())
    case = _case(2 * MiB + 16 * WORLD * 3, "bfloat16", seed=7)
    got = comm.all_reduce(member_input(case, comm.rank, comm.device))
    comm.check_errors()
    same = torch.equal(got.view(torch.int16), expected(case, comm.rank, comm.device).view(torch.int16))
    comm.close()
    return same


@pytest.mark.timeout(300)
def test_ranks_may_run_different_block_counts(pool):
    assert all(pool(WORLD, "cuda").run(_different_blocks_per_rank, timeout=200))


# One communicator whose table runs every all_reduce algorithm by size, so they share the
# group's call counter, slots and arrival packets with the pipelined two-shot.
def _mixed_table():
    from hybridcomm.algorithms import TABLE, Rule

    return {**TABLE, "all_reduce": (Rule(16 * KiB, "nvlink", "one_shot"),
                                    Rule(64 * KiB, "nvlink", "one_shot_lamport"),
                                    Rule(128 * KiB, "nvlink", "two_shot"),
                                    Rule(256 * KiB, "nvlink", "two_shot_bulk"),
                                    Rule(None, "nvlink", "two_shot_pipelined"))}


# (bytes, pipeline params or None) per call of the graph, in order; the algorithm follows from
# the size. Pipelined calls with different chunk sizes and block counts, back to back too.
# The communicator's workspace is small (MIXED_AREA per peer), so the pipelined calls above
# WORLD x MIXED_AREA run as several calls of the kernel.
MIXED_AREA = 256 * KiB
MIXED_CALLS = [(8 * KiB, None), (1 * MiB + 16 * 3, (1 * KiB, 7)), (32 * KiB, None), (3 * MiB, (16 * KiB, 32)),
               (3 * MiB, (4 * KiB, 5)), (96 * KiB, None), (192 * KiB, None), (320 * KiB + 16, (2 * KiB, 16)),
               (2 * KiB, None)]


def _mixed_graph_replays(replays: int, seed: int) -> dict:
    import hybridcomm as hc
    import hybridcomm.kernels as kernels
    from hybridcomm.check import capture, compare, digest, expected, member_input
    from hybridcomm.pipeline import PipelineParams

    kernels.poison_outputs = True
    comm = hc.Communicator(hc.Layout(WORLD), table=_mixed_table(), workspace_bytes=MIXED_AREA)
    nvlink = comm.backends["nvlink"]
    inputs = [torch.empty(n // 2, dtype=torch.bfloat16, device=comm.device) for n, _ in MIXED_CALLS]
    chosen = []

    def calls():
        outs = []
        for x, (_, params) in zip(inputs, MIXED_CALLS):
            nvlink.pipeline = PipelineParams(*params) if params else None  # read at launch: baked in
            outs.append(comm.all_reduce(x))
            chosen.append(comm.last_choice.algorithm)
        return tuple(outs)

    graph, outs = capture(calls)
    rng = random.Random(seed)
    failures, digests = [], []
    for it in range(replays):
        cases = [_case(n, "bfloat16", seed=rng.randrange(1 << 30)) for n, _ in MIXED_CALLS]
        for x, case in zip(inputs, cases):
            x.copy_(member_input(case, comm.rank, comm.device).view(-1))
        for o in outs:
            o.fill_(float("nan"))
        graph.replay()
        for k, (o, case) in enumerate(zip(outs, cases)):
            detail = compare(o, expected(case, comm.rank, comm.device).view(-1), "all")
            if detail:
                failures.append(f"replay {it} call {k} ({MIXED_CALLS[k]}): {detail}")
        digests.append(digest(torch.cat([o.view(-1) for o in outs])))
    torch.cuda.synchronize()
    comm.check_errors()
    del graph
    comm.close()
    return {"failures": failures[:10], "mismatches": len(failures), "digests": digests,
            "algorithms": sorted(set(chosen))}


@pytest.mark.timeout(900)
def test_one_graph_interleaving_every_algorithm_replayed_200_times(pool):
    per_rank = pool(WORLD, "cuda").run(_mixed_graph_replays, 200, 11, timeout=800)
    for rank, result in enumerate(per_rank):
        assert result["mismatches"] == 0, f"rank {rank}: {result['failures']}"
        assert result["algorithms"] == sorted(["one_shot", "one_shot_lamport", "two_shot", "two_shot_bulk",
                                               "two_shot_pipelined"]), result["algorithms"]
    for it in range(200):
        assert len({r["digests"][it] for r in per_rank}) == 1, f"replay {it}: ranks hold different bits"


@pytest.mark.timeout(300)
def test_a_rank_that_skips_a_call_makes_its_peers_raise_peer_timeout(pool):
    timeout_s = 0.5
    results = pool(WORLD, "cuda").run(_skip_a_call, timeout_s, "pipelined", timeout=120)
    last = WORLD - 1
    for rank in range(last):
        message, elapsed, peer, op, group = results[rank]
        assert (peer, op, group) == (last, "all_reduce", "world"), message
        assert elapsed < timeout_s + 30, f"rank {rank} took {elapsed:.1f} s"  # a deadline, not a speed claim


def _chunk_sizes_differ():
    import torch.distributed as dist

    import hybridcomm as hc
    from hybridcomm.pipeline import PipelineParams

    comm = _pipelined(timeout_s=5.0)
    nvlink = comm.backends["nvlink"]
    nvlink.pipeline = PipelineParams(2 * KiB if dist.get_rank() == 1 else 4 * KiB, 8)
    field = None
    try:
        comm.all_reduce(torch.randn(256 * KiB, device="cuda"))
        comm.check_errors()
    except hc.ArgumentMismatch as e:
        field = e.field
    nvlink.pipeline = PipelineParams(4 * KiB, 8)
    total = comm.all_reduce(torch.ones(64 * KiB, device="cuda"))
    comm.check_errors()
    ok = bool((total == WORLD).all())
    comm.close()
    return field, ok


@pytest.mark.timeout(300)
def test_ranks_with_different_chunk_sizes_raise_argument_mismatch_and_stay_usable(pool):
    for field, ok in pool(WORLD, "cuda").run(_chunk_sizes_differ, timeout=200):
        assert field is not None and "chunk" in field, field
        assert ok


# -- all_gather_v / reduce_scatter_v: the pipelined one-shots -----------------------------------
def _row_cases(op: str, seed: int):
    """Uneven rows (zeros included) of 129 units, host- and device-side counts, every dtype,
    reserved NaNs; and 8 KiB rows filling a whole area (512 rows per member)."""
    from hybridcomm import Layout
    from hybridcomm.check import Case

    rng = random.Random(seed)
    cases = []
    for dtype, width in (("bfloat16", 1032), ("float16", 1032), ("float32", 516)):
        for data in ("randn", "reserved"):
            for device_sizes in (False, True):
                sizes = tuple(rng.choice((0, 1, 5, 37, 64)) for _ in range(WORLD - 1)) + (rng.randint(1, 70),)
                cases.append(Case(op, Layout(WORLD), sizes, row_shape=(width,), dtype=dtype, data=data,
                                  device_sizes=device_sizes, seed=rng.randrange(1 << 30)))
    cases.append(Case(op, Layout(WORLD), (512,) * WORLD, row_shape=(4096,), dtype="bfloat16", data="randn", seed=3))
    return cases


def _check_rows(cases, settings):
    import hybridcomm.kernels as kernels
    from hybridcomm.check import check_cases, communicator
    from hybridcomm.pipeline import PipelineParams

    kernels.poison_outputs = True
    comm = communicator(cases[0].layout, "auto", "pipelined")
    nvlink = comm.backends["nvlink"]
    failures = []
    for chunk, blocks in settings:
        nvlink.pipeline = PipelineParams(chunk, blocks)
        for outcome in check_cases(cases, "auto", "all", table="pipelined"):
            if not outcome.ok:
                failures.append(f"chunk {chunk} blocks {blocks}: {outcome.case}: {outcome.detail}")
    comm.check_errors()
    nvlink.pipeline = None
    return failures


@pytest.mark.timeout(600)
@pytest.mark.parametrize("op", ["all_gather_v", "reduce_scatter_v"])
def test_row_ops_bit_for_bit_with_uneven_counts_and_every_dtype(pool, op):
    settings = [(1 * KiB, 5), (64 * KiB, 64)]
    _assert_none(pool(WORLD, "cuda").run(_check_rows, _row_cases(op, 31), settings, timeout=500))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("op", ["all_gather_v", "reduce_scatter_v"])
def test_row_ops_graph_replayed_100_times_with_random_device_side_counts(pool, op):
    from hybridcomm import Layout
    from hybridcomm.check import Case, replay_check

    template = Case(op, Layout(WORLD), (0,) * WORLD, row_shape=(4096,), dtype="bfloat16", data="randn",
                    device_sizes=True)
    per_rank = pool(WORLD, "cuda").run(replay_check, template, 100, 40, "pipelined", 13, timeout=800)
    for rank, result in enumerate(per_rank):
        assert result["mismatches"] == 0, f"rank {rank}: {result['failures']}"
    if op == "all_gather_v":  # every rank holds the same gathered bits
        for it in range(100):
            assert len({r["digests"][it] for r in per_rank}) == 1, f"replay {it}: ranks hold different bits"
