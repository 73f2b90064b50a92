"""The composed "two_step" transitions (two_step.py) on gloo workers: its steps are the
communicator's own row ops, so on CPU they run on the reference backend, and the composition
must give the reference's one-op transition bit for bit (and the oracle's), on every layout of
worlds 2 and 4, uneven counts with zeros, partial and replicated gathers, host and device-side
(CPU tensor) counts, random data with the reserved NaN pattern. tests/test_gpu_two_step.py runs
it on our kernels."""

import random

import pytest

from hybridcomm import Layout, algorithms, ops
from hybridcomm.arguments import parse_sizes
from hybridcomm.check import Case, cross_rank_mismatches, run_case
from hybridcomm.two_step import TwoStep


class TwoStepCalls:
    """The two transitions of a Communicator, run as two_step (what check.run_case calls)."""

    def __init__(self, comm):
        self.comm, self.rank, self.two_step = comm, comm.rank, TwoStep(comm)

    def _sizes(self, dp_sizes):
        return parse_sizes(dp_sizes, self.comm.layout.attn_dp, self.comm.device, "dp_sizes")

    def gather_tokens(self, x, dp_sizes, partial=True):
        return self.two_step.gather_tokens(x, self._sizes(dp_sizes), partial)

    def scatter_tokens(self, y, dp_sizes):
        return self.two_step.scatter_tokens(y, self._sizes(dp_sizes))


def _both(cases):
    """Worker: each case through the reference transition and through two_step; both outcomes."""
    from hybridcomm.check import communicator

    out = []
    for case in cases:
        comm = communicator(case.layout)
        reference = run_case(comm, case, comm.device, "all")
        before = comm.last_choice
        composed = run_case(TwoStepCalls(comm), case, comm.device, "all")
        out.append((reference, composed, comm.last_choice is before))
    return out


def _counts(dp: int, rng: random.Random) -> list[tuple[int, ...]]:
    """Uneven with a zero, fewer rows than attn-TP ranks, all zero, and random."""
    fixed = [(5, 0, 3, 7), (1, 2, 0, 1), (0, 0, 0, 0)]
    return [c[:dp] for c in fixed] + [tuple(rng.randint(0, 9) for _ in range(dp))]


def _cases(world: int) -> list[Case]:
    rng = random.Random(world)
    cases = []
    for lay in Layout.all_for_world(world):
        for device_sizes in (False, True):
            for dtype, data in (("bfloat16", "randn"), ("float32", "reserved"), ("float16", "randn")):
                for sizes in _counts(lay.attn_dp, rng):
                    base = dict(layout=lay, sizes=sizes, row_shape=(16,), dtype=dtype, data=data,
                                device_sizes=device_sizes, seed=rng.randrange(1 << 30))
                    cases += [Case("gather_tokens", partial=True, **base),
                              Case("gather_tokens", partial=False, **base), Case("scatter_tokens", **base)]
    return cases


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 4])
def test_two_step_is_the_reference_transition_bit_for_bit(pool, world):
    cases = _cases(world)
    per_rank = pool(world).run(_both, cases, timeout=240)
    failures = []
    for rank, outcomes in enumerate(per_rank):
        for case, (reference, composed, kept_choice) in zip(cases, outcomes):
            assert reference.ok, f"rank {rank}: the reference itself: {reference.case}: {reference.detail}"
            if not composed.ok or composed.digest != reference.digest:
                why = composed.detail or "bits differ from the reference"
                failures.append(f"rank {rank}: {case.describe()}: {why}")
            assert kept_choice, "a step changed comm.last_choice (it must stay the call's)"
    failures += cross_rank_mismatches(cases, [[c for _, c, _ in outcomes] for outcomes in per_rank])
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:20])


def _tight_capacity(world):
    """Worker: device sizes whose largest count fills the input exactly (check.py's cases keep
    spare rows): per layout, (two_step's shape == the reference's, valid rows equal)."""
    import torch

    from hybridcomm.check import communicator

    out = []
    for lay in Layout.all_for_world(world):
        comm = communicator(lay)
        calls = TwoStepCalls(comm)
        counts = (7, 0, 5, 1)[: lay.attn_dp]
        mine = counts[lay.coords(comm.rank).attn_dp_rank]
        sizes = torch.tensor(counts, dtype=torch.int32)
        torch.manual_seed(comm.rank)
        x, y = torch.randn(max(counts), 16), torch.randn(sum(counts), 16)
        for partial in (True, False):
            x = x if partial else torch.ones_like(x)
            want, got = comm.gather_tokens(x, sizes, partial), calls.gather_tokens(x, sizes, partial)
            out.append((f"{lay.name} gather partial={partial}", want.shape, got.shape,
                        bool(got[: sum(counts)].equal(want[: sum(counts)]))))
        want, got = comm.scatter_tokens(y, sizes), calls.scatter_tokens(y, sizes)
        out.append((f"{lay.name} scatter", want.shape, got.shape, bool(got[:mine].equal(want[:mine]))))
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 4])
def test_device_sizes_at_full_capacity_keep_the_transition_s_capacity(pool, world):
    for outcomes in pool(world).run(_tight_capacity, world, timeout=60):
        for what, want_shape, got_shape, equal in outcomes:
            assert got_shape == want_shape and equal, (what, want_shape, got_shape, equal)


def _nvlink_without_kernels(comm):
    """The nvlink backend as the Communicator holds it, minus the workspace and kernels (which
    need GPUs): enough to reach its two_step dispatch and its blocker."""
    from types import SimpleNamespace

    from hybridcomm.backends.nvlink import NvlinkBackend

    backend = NvlinkBackend.__new__(NvlinkBackend)
    backend.layout, backend.groups, backend.timeout_s = comm.layout, comm.groups, comm.timeout_s
    backend.two_step, backend.handles = TwoStep(comm), {name: 0 for name in comm.groups}
    backend.workspace = SimpleNamespace(blocker=None, args={})
    return backend


def _through_the_communicator(world, seed):
    """Worker: a CPU Communicator whose table sends the transitions to nvlink/two_step (its
    steps to the reference): the public calls with host, device and own (Counts) sizes, the
    Counts kept for the scatter, last_choice; against a plain Communicator's results."""
    import torch

    import hybridcomm as hc
    from hybridcomm.algorithms import Choice

    out = []
    for lay in Layout.all_for_world(world):
        if lay.moe_tp != 1:
            continue
        comm, plain = hc.Communicator(lay), hc.Communicator(lay)
        comm.backends["nvlink"] = _nvlink_without_kernels(comm)
        steps = comm._decide
        comm._decide = lambda op, *a: Choice("nvlink", "two_step", "test") if op.endswith("_tokens") else steps(op, *a)
        c = lay.coords(comm.rank)
        rng = random.Random(seed)
        counts = [rng.randint(1, 6) for _ in range(lay.attn_dp)]
        if lay.attn_dp > 1:
            counts[rng.randrange(lay.attn_dp)] = 0
        mine = counts[c.attn_dp_rank]
        torch.manual_seed(seed + comm.rank)
        rows = {"host": mine, "device": max(counts) + 2, "own": max(counts) + 2}  # device: one capacity
        for kind in ("host", "device", "own"):
            x = torch.randn(rows[kind], 16, dtype=torch.bfloat16)
            y = torch.randn(sum(counts), 16, dtype=torch.bfloat16)
            copy = torch.Generator().manual_seed(seed + 100 * c.attn_dp_rank)  # the same on a group's attn-TP ranks
            replicated = torch.randn(rows[kind], 16, generator=copy).to(torch.bfloat16)
            def sizes():
                if kind == "host":
                    return counts
                if kind == "device":
                    return torch.tensor(counts, dtype=torch.int32)
                return hc.Counts(torch.tensor([mine], dtype=torch.int32))
            for partial in (True, False):
                xs = x if partial else replicated
                got, want = comm.gather_tokens(xs, sizes(), partial), plain.gather_tokens(xs, sizes(), partial)
                out.append((f"{lay.name} gather {kind} partial={partial}", comm.last_choice.algorithm,
                            bool(got[: sum(counts)].equal(want[: sum(counts)]))))
            shared = sizes()
            if kind == "own":  # the gather exchanges the Counts; the scatter reuses them
                comm.gather_tokens(x, shared)
                out.append((f"{lay.name} Counts learned", comm.last_choice.algorithm, shared.sizes.tolist() == counts))
            got, want = comm.scatter_tokens(y, shared), plain.scatter_tokens(y, counts)
            same = bool(got[:mine].equal(want[:mine]))
            out.append((f"{lay.name} scatter {kind}", comm.last_choice.algorithm, same))
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 4])
def test_the_communicator_reaches_two_step_through_the_nvlink_backend(pool, world):
    for outcomes in pool(world).run(_through_the_communicator, world, 5, timeout=90):
        for what, algorithm, equal in outcomes:
            assert algorithm == "two_step" and equal, (what, algorithm, equal)


def _blockers():
    import torch

    from hybridcomm.check import communicator

    comm = communicator(Layout(2, attn_tp=2))
    backend, world = _nvlink_without_kernels(comm), comm.groups["world"]
    odd = torch.zeros(4, 3, dtype=torch.float16)  # rows of 6 bytes: no kernel takes them
    return [backend.blocker(op, algorithm, world, odd, parse_sizes([4], 1, comm.device, "dp_sizes"))
            for op in ("gather_tokens", "scatter_tokens") for algorithm in ("two_step", "one_shot")]


def test_two_step_leaves_the_blocking_to_its_steps(pool):
    for two_step, one_shot, scatter_two_step, scatter_one_shot in pool(2).run(_blockers, timeout=60):
        assert two_step is None and scatter_two_step is None  # each step is checked when it is selected
        assert "rows of 6 bytes" in one_shot and "rows of 6 bytes" in scatter_one_shot


def test_chunk_sizes_on_the_device_are_the_host_s():
    import torch

    from hybridcomm.arguments import Sizes, split_evenly, split_sizes

    rng = random.Random(3)
    for _ in range(300):
        dp, tp = rng.randint(1, 8), rng.choice([1, 2, 3, 4, 8])
        counts = tuple(rng.choice([0, 1, 2, rng.randint(0, 5000)]) for _ in range(dp))
        on_device = split_sizes(Sizes(dp, device=torch.tensor(counts, dtype=torch.int32)), tp)
        assert on_device.dtype == torch.int32 and on_device.is_contiguous()
        assert on_device.tolist() == split_sizes(Sizes(dp, host=counts), tp) == [
            c for n in counts for c in split_evenly(n, tp)], (counts, tp)


def test_two_step_is_an_algorithm_of_both_transitions_that_tables_can_name():
    for op in ("gather_tokens", "scatter_tokens"):
        assert ops.OPS[op].algorithm("two_step").composed
    assert algorithms.NAMED_TABLES["two_step"]["gather_tokens"] == (algorithms.Rule(None, "nvlink", "two_step"),)
    assert algorithms.NAMED_TABLES["two_step"]["scatter_tokens"] == (algorithms.Rule(None, "nvlink", "two_step"),)
    assert algorithms.NAMED_TABLES["two_step"]["all_gather_v"] == algorithms.TABLE["all_gather_v"]  # its steps' rules
