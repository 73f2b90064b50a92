"""GPU tests of the quantized gathers' row teams (csrc/quant_rows.cuh quant_grid): plain rows
(attention TP 1, or replicated rows) of the block formats (fp8_block128, nvfp4), and of fp8 up
to 8 KB of input a row, are worked by teams of 512 threads that span 4 blocks of 128 or 2 of 256
threads when the grid fits the SM budget that way, else by full blocks (splits_rows). In the
Lamport kernel plain rows of at most 256 data lanes (nvfp4 up to hidden 4096, the fp8 formats up
to 2048) have teams of 256 threads, of at most 128 lanes (nvfp4 up to 2048, fp8 up to 1024) teams
of 128 (team_threads), in the same grids: 2 blocks of 128 or one block, or two to four teams in a
block, each meeting at its own barrier (the LL kernel keeps teams of 512 there: the same cases
check it). With max_sms=16 the counts below put each kernel
(`quant` on LL, `quant_lamport`) in every band; 41 rows give the teams of one block different
numbers of rows (a barrier shared by the block would hang there).

What a split team could get wrong: a lane that no block of the team covers (outputs are
poisoned first), an fp8 row's max taken over less than the whole row (each block of the team
takes it over its share of the row's input), a scale lane formed across a team's blocks, the
next row's prefetch, a team index past the rows. Every case is compared bit for bit with the
reference quantizer applied to the reference gather, on random data, uneven counts with zeros,
host and device counts; rows of 4096, 7168 (two data lanes a thread for fp8 and fp8_block128;
fp8 not split there) and 1040 (nvfp4 rows of 65 lanes, not a whole number of warps); bf16,
fp16 and fp32 (fp8 in fp32: split at 2048, whole at 4096).

The largest hidden size (abi.MAX_QUANT_HIDDEN, 11264: three data lanes a thread for the fp8
formats, two for nvfp4) runs in every row mode -- plain, reduced over attention TP, fused with
the norm --: the kernel instances of the most lanes a thread, which no other test reaches.
"""

import pytest

from conftest import gpu_world, needs_gpus
from hybridcomm import Layout, abi
from hybridcomm.check import Case
from hybridcomm.quant.check import QuantCase, check_poisoned_quant_cases, quant_replay_check

pytestmark = [pytest.mark.gpu, needs_gpus(2)]

WORLD = gpu_world()
MAX_SMS = 16
# Largest counts: a team of 4 x 128 threads (1-3 rows), of 2 x 256 (6), full blocks (12, 40, 41);
# 256-thread teams in the same grids: 2 x 128 (1-3), one block of 256 (6), two a full block (12,
# 40, 41: 16 blocks, and teams 8 and 9 of 32 hold 2 and 1 rows); 128-thread teams one a block of
# 128, two of 256, four of 512 (41 rows: teams 8 and 9 of 64 hold 2 and 1).
ROWS = (1, 3, 6, 12, 40, 41)
ALGORITHM = {"quant_ll": "quant", "lamport": "quant_lamport"}


def _counts(n: int, rows: int) -> tuple[int, ...]:
    """n counts whose largest is rows: uneven; of more than two members the last has none, of two
    the second has rows // 2 (none at 1 row)."""
    return tuple(rows if i == 0 else (rows // (i + 1) if i < n - 1 or n == 2 else 0) for i in range(n))


def _shapes() -> list[tuple[str, int, str, tuple[int, ...]]]:
    """(format, hidden, dtype, largest counts)."""
    shapes = [(fmt, 4096, "bfloat16", ROWS) for fmt in ("fp8", "fp8_block128", "nvfp4")]
    shapes += [(fmt, 7168, "bfloat16", (1, 3, 6)) for fmt in ("fp8", "fp8_block128", "nvfp4")]
    shapes += [(fmt, 1040, "bfloat16", (1, 6)) for fmt in ("fp8", "nvfp4")]
    shapes += [(fmt, 4096, dtype, (1, 3)) for fmt in ("fp8", "fp8_block128", "nvfp4")
               for dtype in ("float16", "float32")]
    shapes += [("fp8", 2048, "float32", (1, 3))]
    shapes += [(fmt, 2048, "bfloat16", ROWS) for fmt in ("fp8", "fp8_block128")]  # 256-thread teams
    shapes += [("nvfp4", 2048, "bfloat16", ROWS), ("fp8", 1024, "bfloat16", ROWS)]  # 128-thread teams
    return shapes


def _quant_cases() -> list[QuantCase]:
    """Plain rows: gather_tokens on DP, gather_tokens of replicated rows on attention TP 2, and
    all_gather_v; each shape at each of its counts, host and device counts."""
    layouts = [("gather_tokens", Layout(WORLD), True), ("gather_tokens", Layout(WORLD, attn_tp=2), False),
               ("all_gather_v", Layout(WORLD), True)]
    cases = []
    for fmt, hidden, dtype, counts in _shapes():
        for op, lay, partial in layouts:
            n = lay.attn_dp if op == "gather_tokens" else WORLD
            for rows in counts:
                for device_sizes in (False, True):
                    case = Case(op, lay, _counts(n, rows), row_shape=(hidden,), dtype=dtype, data="randn",
                                partial=partial, device_sizes=device_sizes, seed=len(cases))
                    cases.append(QuantCase(case, fmt, scale_tensor=device_sizes))
    return cases


def _replays_match_the_oracle(pool, fmt: str, hidden: int, capacity: int, seed: int, table: str,
                              own_counts: bool) -> list[dict]:
    """One DP gather graph of `capacity` rows a group, replayed 8 times with random counts and
    fresh data (quant_replay_check) on `table`'s kernel: no failure on any rank; the ranks'
    results."""
    lay = Layout(WORLD)
    case = Case("gather_tokens", lay, (1,) * lay.attn_dp, row_shape=(hidden,), dtype="bfloat16", data="randn",
                device_sizes=True)
    per_rank = pool(WORLD, "cuda").run(quant_replay_check, QuantCase(case, fmt), 8, capacity, seed, table,
                                       own_counts, timeout=600)
    failures = [f"rank {r}: {f}" for r, res in enumerate(per_rank) for f in res["failures"]]
    failures += [f"rank {r}: ran {res['ran']}" for r, res in enumerate(per_rank)
                 if res["ran"] != f"nvlink/{ALGORITHM[table]}"]
    assert not failures, "\n".join(failures[:20])
    return per_rank


@pytest.mark.timeout(900)
@pytest.mark.parametrize("table", sorted(ALGORITHM))
def test_plain_rows_on_split_and_whole_teams_match_the_reference_quantizer(pool, table):
    qcases = _quant_cases()
    per_rank = pool(WORLD, "cuda").run(check_poisoned_quant_cases, qcases, "auto", table, "all", MAX_SMS,
                                       timeout=900)
    failures = [f"rank {r}: {q.describe()}: {detail}" for r, res in enumerate(per_rank)
                for q, (detail, _, _) in zip(qcases, res) if detail]
    failures += [f"rank {r}: {q.describe()}: ran {ran}" for r, res in enumerate(per_rank)
                 for q, (_, _, ran) in zip(qcases, res) if ran != f"nvlink/{ALGORITHM[table]}"]
    failures += [f"{q.describe()}: ranks hold different bits" for i, q in enumerate(qcases)
                 if q.case.op == "gather_tokens" and len({res[i][1] for res in per_rank}) > 1]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:30])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("own_counts", [False, True], ids=["all-counts", "own-count"])
@pytest.mark.parametrize("table", sorted(ALGORITHM))
@pytest.mark.parametrize("fmt", ["fp8", "fp8_block128", "nvfp4"])
def test_split_teams_in_graph_replays_with_new_counts(pool, fmt, table, own_counts):
    """One graph of a split team's grid (capacity 2 rows a DP group: a row's team in 128-thread
    blocks, 4 or, narrow, 2), replayed with random counts of 0-2 rows per group and fresh data."""
    per_rank = _replays_match_the_oracle(pool, fmt, 4096, 2, 5, table, own_counts)
    for it in range(8):  # every rank holds the same gathered bits
        assert len({res["digests"][it] for res in per_rank}) == 1, f"replay {it}"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("own_counts", [False, True], ids=["all-counts", "own-count"])
@pytest.mark.parametrize("table", sorted(ALGORITHM))
@pytest.mark.parametrize("fmt, hidden", [("nvfp4", 4096), ("fp8", 2048), ("nvfp4", 2048), ("fp8_block128", 1024)])
def test_narrow_teams_in_graph_replays_with_new_counts(pool, fmt, hidden, table, own_counts):
    """One graph of narrow teams (256 threads; 128 for nvfp4 2048 and fp8_block128 1024; the
    Lamport kernel's, the LL kernel's rows of the same widths in teams of 512) in full blocks
    (capacity 256 rows a DP group: full blocks on any SM budget, and the most that fits the
    LL areas for nvfp4 4096), replayed with random counts of 0-256 rows per group: the teams of a
    block often work different numbers of rows."""
    _replays_match_the_oracle(pool, fmt, hidden, 256, 7, table, own_counts)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("table", sorted(ALGORITHM))
def test_the_largest_hidden_size_in_every_row_mode(pool, table):
    """hidden = abi.MAX_QUANT_HIDDEN (the most data lanes a thread): every format, DP rows and,
    on attention TP 2, partial, replicated and fused rows, host and device counts."""
    hidden, cases = abi.MAX_QUANT_HIDDEN, []
    dp, tp = Layout(WORLD), Layout(WORLD, attn_tp=2)
    variants = [(dp, True, False), (tp, True, False), (tp, False, False), (tp, True, True)]
    for fmt in ("fp8", "fp8_block128", "nvfp4"):
        for lay, partial, fused in variants:
            for device_sizes in (False, True):
                case = Case("gather_tokens", lay, _counts(lay.attn_dp, 3), row_shape=(hidden,), dtype="bfloat16",
                            data="randn", partial=partial, fused=fused, device_sizes=device_sizes, seed=len(cases))
                cases.append(QuantCase(case, fmt, scale_tensor=device_sizes))
    per_rank = pool(WORLD, "cuda").run(check_poisoned_quant_cases, cases, "auto", table, "all", MAX_SMS,
                                       timeout=600)
    failures = [f"rank {r}: {q.describe()}: {detail}" for r, res in enumerate(per_rank)
                for q, (detail, _, _) in zip(cases, res) if detail]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:30])
