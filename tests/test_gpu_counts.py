"""GPU tests of counts exchanged inside our gather kernels (csrc/own_count.cuh, counts.py), on 2,
4 or 8 GPUs (conftest.gpu_world; skipped with fewer).

A gather given `hc.Counts(own)` with `own` a 1-element int32 device tensor: each rank passes
only its own (DP group's) count; the kernel exchanges the counts, writes them to `counts.sizes`,
and the scatter that follows reads them there. Checked for every algorithm the tables can pick
(LL one-shot, gather_tokens two-shot, the fused norm on LL and on Lamport, the Lamport one-shot), every layout of
the world, uneven counts with zeros, random data, against the oracle (bit for bit; the fused
norm within one rounding) and against the reference backend given the same Counts:

- eager, with a count of the all-gathers torch.distributed ran: none on the in-kernel path
  (the exchange before an op is seen to use one, so the counter works);
- one CUDA graph of gather + scatter captured once and replayed 200 times with new device
  counts and new data;
- a count beyond the capacity: CapacityExceeded on every rank; attn-TP ranks of one DP group
  that pass different counts: ArgumentMismatch on every rank; the next call works.

The quantized gathers (every algorithm: quant, quant_one_hop, quant_lamport, quant_local; every
format; gather_tokens reduced, replicated and fused, all_gather_v) in CUDA graphs replayed with new own
counts: data and scales bit for bit against the quantized oracle, the learned counts, no
all-gather; and the two errors above with quant="fp8" (the mismatch also with replicated rows,
partial=False, which the quantized gathers send before they learn the counts).
"""

import random

import pytest
import torch

from conftest import needs_gpus
from test_gpu import MAIN_LAYOUTS, MIXED_LAYOUT, WORLD
from hybridcomm.check import (Case, capture, communicator, compare, expected, fusion_inputs, member_input,
                              replay_sizes)
from hybridcomm.ops import OPS
from hybridcomm.quant import FORMATS
from hybridcomm.quant.check import QuantCase, compare_quantized, oracle, quant_replay_check, trim

pytestmark = [pytest.mark.gpu, needs_gpus(2)]

LAYOUTS = MAIN_LAYOUTS + [MIXED_LAYOUT]
# With "auto" (the fused norm on LL) every algorithm of both gathers; "lamport" has the fused one's too.
TABLES = ("one_shot", "two_shot", "lamport")
CAPACITY = 6


# -- helpers run on the workers ------------------------------------------------------------------
class AllGatherCounter:
    """Counts the all-gathers torch.distributed runs (the exchange before the op uses one)."""

    def __init__(self):
        import torch.distributed as dist

        from hybridcomm import collectives

        self.calls = 0
        self.saved = {(dist, "all_gather"): dist.all_gather,
                      (collectives, "all_gather_single"): collectives.all_gather_single}
        for (module, name), fn in self.saved.items():
            setattr(module, name, self._counting(fn))

    def _counting(self, fn):
        def wrapped(*args, **kwargs):
            self.calls += 1
            return fn(*args, **kwargs)
        return wrapped

    def close(self):
        for (module, name), fn in self.saved.items():
            setattr(module, name, fn)


def variants(layout) -> list[tuple[str, str, bool, bool]]:
    """(op, group, partial, fused) of every gather this layout runs."""
    found = [("gather_tokens", "world", True, False), ("gather_tokens", "world", False, False),
             ("gather_tokens", "world", True, True), ("gather_tokens", "world", False, True)]
    found += [("all_gather_v", g, True, False) for g in ("world", "attn_tp", "attn_dp", "moe_tp", "moe_ep")
              if len(layout.group_ranks(g, 0)) > 1]
    return found


def my_entry(case: Case, rank: int) -> int:
    """This rank's index in case.sizes: its DP group's (token ops) or its place in the group."""
    if case.op.endswith("tokens"):
        return case.layout.coords(rank).attn_dp_rank
    return case.layout.group_ranks(case.group, rank).index(rank)


def scatter_case(case: Case, seed: int) -> Case:
    """The scatter that follows a gather, with the same counts."""
    op = "scatter_tokens" if case.op == "gather_tokens" else "reduce_scatter_v"
    return Case(op, case.layout, case.sizes, case.group, case.row_shape, case.dtype, case.data, seed=seed,
                device_sizes=True)


def gather(comm, case: Case, x, counts, residual=None, weight=None):
    if case.op == "all_gather_v":
        return comm.all_gather_v(x, counts, case.group)
    if case.fused:
        return comm.gather_tokens(x, counts, case.partial, residual=residual, norm_weight=weight, eps=1e-6)
    return comm.gather_tokens(x, counts, case.partial)


def scatter(comm, case: Case, y, counts):
    """`case`: the scatter's (scatter_case)."""
    if case.op == "scatter_tokens":
        return comm.scatter_tokens(y, counts)
    return comm.reduce_scatter_v(y, counts, case.group)


def fill(buffer: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """rows at the top of `buffer`, the rest a value that would show if read."""
    buffer.fill_(1e4)
    buffer[: rows.shape[0]] = rows
    return buffer


def fusion_buffers(case: Case, rank: int, device):
    if not case.fused:
        return None, None
    residual, weight = fusion_inputs(case, case.layout.coords(rank).attn_dp_rank, device)
    return fill(torch.empty((CAPACITY,) + case.row_shape, dtype=residual.dtype, device=device), residual), weight


def _trimmed(out, case: Case, rank: int):
    total = sum(case.sizes)
    if case.fused:
        return out[0][:total], out[1][: case.sizes[my_entry(case, rank)]]
    return out[:total]


# -- eager ---------------------------------------------------------------------------------------
def _eager(layout, table: str, seed: int) -> list[str]:
    import hybridcomm as hc
    from hybridcomm.counts import exchange

    comm = communicator(layout, "auto", table)
    reference = communicator(layout, "reference")
    rank, device = comm.rank, comm.device
    rng = random.Random(seed)
    failures = []
    counter = AllGatherCounter()
    try:
        # What the in-kernel exchange replaces: the all-gather before the op, counted here.
        exchange(hc.Counts(torch.ones(1, dtype=torch.int32, device=device)), comm.groups["world"], device)
        if counter.calls != 1:
            failures.append(f"the exchange before an op ran {counter.calls} counted all-gathers, expected 1")
        for op, group, partial, fused in variants(layout):
            n = layout.attn_dp if op == "gather_tokens" else len(layout.group_ranks(group, 0))
            for dtype in ("bfloat16", "float32"):
                sizes = [rng.randint(1, CAPACITY) for _ in range(n)]
                if n > 1:
                    sizes[rng.randrange(n)] = 0
                case = Case(op, layout, tuple(sizes), group, (64,), dtype, "randn", partial, fused, True,
                            rng.randrange(1 << 30))
                what = f"{case.describe()} table={table}"
                me = my_entry(case, rank)
                inp = member_input(case, rank, device)
                x = fill(torch.empty((CAPACITY,) + case.row_shape, dtype=inp.dtype, device=device), inp)
                residual, weight = fusion_buffers(case, rank, device)
                own = torch.tensor([sizes[me]], dtype=torch.int32, device=device)
                counts = hc.Counts(own)
                before = counter.calls
                got = gather(comm, case, x, counts, residual, weight)
                if counter.calls != before or comm.last_choice.backend != "nvlink":
                    failures.append(f"{what}: {counter.calls - before} all-gathers before the op, "
                                    f"ran on {comm.last_choice}")
                learned = counts.sizes.tolist()
                if learned != sizes:
                    failures.append(f"{what}: counts.sizes {learned}")
                detail = compare(_trimmed(got, case, rank), expected(case, rank, device), "sums", fused)
                if detail:
                    failures.append(f"{what}: gather {detail}")
                # The reference, given the same own count (it exchanges it before the op).
                ref_counts = hc.Counts(own.clone())
                want = gather(reference, case, x, ref_counts, residual, weight)
                detail = compare(_trimmed(got, case, rank), _trimmed(want, case, rank), "sums", fused)
                if detail:
                    failures.append(f"{what}: against the reference backend: {detail}")
                # The scatter that follows reads the counts the kernel wrote.
                sc = scatter_case(case, rng.randrange(1 << 30))
                y = fill(torch.empty((n * CAPACITY,) + case.row_shape, dtype=inp.dtype, device=device),
                         member_input(sc, rank, device))
                out = scatter(comm, sc, y, counts)[: sizes[me]]
                detail = compare(out, expected(sc, rank, device), "sums")
                if detail:
                    failures.append(f"{what}: the scatter after it: {detail}")
                ref_out = scatter(reference, sc, y, ref_counts)[: sizes[me]]
                detail = compare(out, ref_out, "sums")
                if detail:
                    failures.append(f"{what}: the scatter against the reference backend: {detail}")
        comm.check_errors()
    finally:
        counter.close()
    return failures


@pytest.mark.timeout(900)
@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: lay.name)
def test_gathers_exchange_the_counts_in_the_kernel_and_match_the_reference(pool, layout, table):
    per_rank = pool(WORLD, "cuda").run(_eager, layout, table, 11, timeout=600)
    failures = [f"rank {r}: {f}" for r, fs in enumerate(per_rank) for f in fs]
    assert not failures, "\n".join(failures[:20])


# -- CUDA graph ------------------------------------------------------------------------------------
def _replays(layout, variant, table: str, replays: int, seed: int) -> dict:
    import hybridcomm as hc

    op, group, partial, fused = variant
    comm = communicator(layout, "auto", table)
    rank, device = comm.rank, comm.device
    n = layout.attn_dp if op == "gather_tokens" else len(layout.group_ranks(group, 0))
    template = Case(op, layout, (0,) * n, group, (256,), "bfloat16", "randn", partial, fused, True)
    me = my_entry(template, rank)
    x = torch.zeros((CAPACITY, 256), dtype=torch.bfloat16, device=device)
    residual, weight = torch.zeros_like(x), torch.zeros(256, dtype=x.dtype, device=device)
    y = torch.zeros((n * CAPACITY, 256), dtype=x.dtype, device=device)
    own = torch.full((1,), CAPACITY, dtype=torch.int32, device=device)

    def step():
        counts = hc.Counts(own)
        gathered = gather(comm, template, x, counts, residual if fused else None, weight if fused else None)
        return gathered, counts.sizes, scatter(comm, scatter_case(template, 0), y, counts)

    counter = AllGatherCounter()
    try:
        graph, (gathered, learned, scattered) = capture(step)
    finally:
        counter.close()
    rng = random.Random(seed)
    failures = []
    if counter.calls:
        failures.append(f"{counter.calls} all-gathers while capturing (expected the kernel to exchange the counts)")
    for it in range(replays):
        sizes = replay_sizes(rng, n, CAPACITY, it)
        case = Case(op, layout, tuple(sizes), group, (256,), "bfloat16", "randn", partial, fused, True,
                    seed * 1000003 + it)
        sc = scatter_case(case, seed * 1000033 + it)
        fill(x, member_input(case, rank, device))
        if fused:
            r, w = fusion_inputs(case, layout.coords(rank).attn_dp_rank, device)
            fill(residual, r)
            weight.copy_(w)
        fill(y, member_input(sc, rank, device))
        own.fill_(sizes[me])
        for t in (gathered if fused else (gathered,)) + (scattered,):
            t.fill_(float("nan"))
        learned.fill_(-1)
        graph.replay()
        detail = compare(_trimmed(gathered, case, rank), expected(case, rank, device), "sums", fused)
        detail = detail or compare(scattered[: sizes[me]], expected(sc, rank, device), "sums")
        if learned.tolist() != sizes:
            detail += f" counts.sizes {learned.tolist()}"
        if detail:
            failures.append(f"replay {it} sizes {sizes}: {detail}")
    torch.cuda.synchronize()
    comm.check_errors()
    del graph
    return {"failures": failures[:10], "mismatches": len(failures)}


def replay_variants():
    """(layout, variant, table): every algorithm of both gathers, on every layout."""
    found = []
    for layout in MAIN_LAYOUTS:
        for variant in variants(layout):
            op, group, partial, fused = variant
            tables = ("auto", "lamport") if fused else ("one_shot", "lamport")
            if op == "gather_tokens" and partial and not fused:
                tables += ("two_shot",)
            if op == "all_gather_v" and group != "world":
                tables = ("one_shot",)
            found += [(layout, variant, table) for table in tables]
    return found


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("layout,variant,table", replay_variants(),
                         ids=lambda v: v.name if hasattr(v, "name") else "-".join(map(str, v)) if
                         isinstance(v, tuple) else str(v))
def test_one_graph_of_gather_and_scatter_replays_200_times_with_new_own_counts(pool, layout, variant, table):
    per_rank = pool(WORLD, "cuda").run(_replays, layout, variant, table, 200, 5, timeout=900)
    for rank, result in enumerate(per_rank):
        assert result["mismatches"] == 0, f"rank {rank}: {result['failures']}"


# -- errors ------------------------------------------------------------------------------------------
def _bad_counts(layout, table: str, kind: str, quant: str | None = None, partial: bool = True, fused: bool = False):
    """kind "capacity": DP group 0 passes more rows than its input holds; "differ": the attn-TP
    ranks of DP group 0 pass different counts. Returns (what check_errors raised, whether
    the next call with good counts matched the oracle). quant: the gathers quantize so.
    partial=False: replicated rows, which the quantized gathers send before they learn the
    counts (csrc/quant_rows.cuh stage_my_rows). fused: with residual add + RMSNorm."""
    import hybridcomm as hc

    comm = communicator(layout, "auto", table)
    rank, device = comm.rank, comm.device
    c = layout.coords(rank)
    sizes = tuple(2 + d % 3 for d in range(layout.attn_dp))
    case = Case("gather_tokens", layout, sizes, "world", (64,), "bfloat16", "randn", partial, fused, True, 3)
    x = fill(torch.empty((CAPACITY, 64), dtype=torch.bfloat16, device=device), member_input(case, rank, device))
    norm = {}
    if fused:
        r, w = fusion_inputs(case, c.attn_dp_rank, device)
        norm = dict(residual=fill(torch.empty((CAPACITY, 64), dtype=torch.bfloat16, device=device), r), norm_weight=w)
    mine = sizes[c.attn_dp_rank]
    if c.attn_dp_rank == 0:
        # "differ": within the capacity on every rank (tp8's rank 5 would pass 7 > 6 with + attn_tp_rank,
        # and rightly raise CapacityExceeded instead)
        mine = CAPACITY + 1 if kind == "capacity" else mine + c.attn_tp_rank % 2
    comm.gather_tokens(x, hc.Counts(torch.tensor([mine], dtype=torch.int32, device=device)), partial, quant=quant,
                       **norm)
    try:
        comm.check_errors()
        raised = None
    except (hc.CapacityExceeded, hc.ArgumentMismatch) as e:
        raised = f"{type(e).__name__}: {e}"
    counts = hc.Counts(torch.tensor([sizes[c.attn_dp_rank]], dtype=torch.int32, device=device))
    got = comm.gather_tokens(x, counts, partial, quant=quant, **norm)
    comm.check_errors()
    if fused:
        got = (got[0][: sum(sizes)], got[1][: sizes[c.attn_dp_rank]])
        return raised, compare(got, expected(case, rank, device), "sums", fused=True) == ""
    if quant is None:
        return raised, compare(got[: sum(sizes)], expected(case, rank, device), "sums") == ""
    want, _, rows, _ = oracle(QuantCase(case, quant), rank, device)
    return raised, compare_quantized(trim(got, sum(sizes)), want, rows) == ""


QUANT_TABLES = ("quant_ll", "quant_one_hop", "lamport", "quant_local")  # each quantized algorithm forced


@pytest.mark.timeout(300)
@pytest.mark.parametrize("table", TABLES + QUANT_TABLES)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: lay.name)
def test_a_count_beyond_the_capacity_raises_on_every_rank(pool, layout, table):
    quant = "fp8" if table in QUANT_TABLES else None
    per_rank = pool(WORLD, "cuda").run(_bad_counts, layout, table, "capacity", quant, timeout=120)
    for rank, (raised, ok) in enumerate(per_rank):
        assert raised is not None and raised.startswith("CapacityExceeded"), f"rank {rank}: {raised}"
        assert ok, f"rank {rank}: the next call did not match the oracle"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("table", TABLES + QUANT_TABLES)
@pytest.mark.parametrize("layout", [lay for lay in LAYOUTS if lay.attn_tp > 1], ids=lambda lay: lay.name)
def test_attn_tp_ranks_passing_different_counts_raise_on_every_rank(pool, layout, table):
    quant = "fp8" if table in QUANT_TABLES else None
    per_rank = pool(WORLD, "cuda").run(_bad_counts, layout, table, "differ", quant, timeout=120)
    _assert_mismatch_raised(per_rank)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("table", ("quant_ll", "lamport"))
@pytest.mark.parametrize("layout", [lay for lay in LAYOUTS if lay.attn_tp > 1], ids=lambda lay: lay.name)
def test_replicated_quantized_rows_sent_before_a_count_mismatch_raise_on_every_rank(pool, layout, table):
    per_rank = pool(WORLD, "cuda").run(_bad_counts, layout, table, "differ", "fp8", False, timeout=120)
    _assert_mismatch_raised(per_rank)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("table", ("auto", "lamport"))  # the fused gather on LL, and on Lamport where it is one hop
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: lay.name)
def test_fused_gathers_given_bad_counts_raise_on_every_rank(pool, layout, table):
    per_rank = pool(WORLD, "cuda").run(_bad_counts, layout, table, "capacity", None, True, True, timeout=120)
    for rank, (raised, ok) in enumerate(per_rank):
        assert raised is not None and raised.startswith("CapacityExceeded"), f"rank {rank}: {raised}"
        assert ok, f"rank {rank}: the next call did not match the oracle"
    if layout.attn_tp > 1:  # partial rows, and replicated ones (fused_lamport sends those before it learns the counts)
        for partial in (True, False):
            _assert_mismatch_raised(pool(WORLD, "cuda").run(_bad_counts, layout, table, "differ", None, partial, True,
                                                            timeout=120))


def _assert_mismatch_raised(per_rank: list) -> None:
    for rank, (raised, ok) in enumerate(per_rank):
        assert raised is not None and raised.startswith("ArgumentMismatch") and "row counts" in raised, \
            f"rank {rank}: {raised}"
        assert ok, f"rank {rank}: the next call did not match the oracle"


# -- quantized gathers ---------------------------------------------------------------------------
QUANT_VARIANTS = [("gather_tokens", True, False), ("gather_tokens", False, False), ("gather_tokens", True, True),
                  ("all_gather_v", True, False)]


def _quant_own_counts(qcases, table: str, replays: int) -> list[dict]:
    """quant_replay_check with own counts for each case, counting the all-gathers torch.distributed
    runs meanwhile (none: the kernel exchanges the counts)."""
    results = []
    for q in qcases:
        communicator(q.case.layout, "auto", table)  # created (collectively) before counting
        counter = AllGatherCounter()
        try:
            result = quant_replay_check(q, replays, CAPACITY, 7, table, own_counts=True)
        finally:
            counter.close()
        results.append(dict(result, all_gathers=counter.calls))
    return results


@pytest.mark.timeout(900)
@pytest.mark.parametrize("table,algorithm", list(zip(QUANT_TABLES, ("quant", "quant_one_hop", "quant_lamport",
                                                                   "quant_local"))))
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_quantized_gathers_exchange_the_counts_in_the_kernel_over_graph_replays(pool, fmt, table, algorithm):
    qcases = []
    for layout in MAIN_LAYOUTS:
        for op, partial, fused in QUANT_VARIANTS:
            if algorithm not in [a.name for a in OPS[f"{op}_quant"].algorithms]:
                continue  # (quant_local: gather_tokens only)
            n = layout.attn_dp if op == "gather_tokens" else WORLD
            qcases.append(QuantCase(Case(op, layout, (1,) * n, row_shape=(512,), dtype="bfloat16", data="randn",
                                         partial=partial, fused=fused, device_sizes=True), fmt))
    per_rank = pool(WORLD, "cuda").run(_quant_own_counts, qcases, table, 20, timeout=600)
    failures = []
    for rank, results in enumerate(per_rank):
        for q, res in zip(qcases, results):
            what = f"rank {rank}: {q.describe()}"
            failures += [f"{what}: {f}" for f in res["failures"]]
            if res["all_gathers"]:
                failures.append(f"{what}: {res['all_gathers']} all-gathers (the kernel should exchange the counts)")
            if res["ran"] != f"nvlink/{algorithm}":
                failures.append(f"{what}: ran {res['ran']}")
    assert not failures, "\n".join(failures[:20])
