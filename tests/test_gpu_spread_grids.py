"""GPU tests of the unquantized kernels' block sizes (csrc/launch.cuh spread_grid): a call's work
goes to as many SMs as the group may use before its blocks grow, so with max_sms=16 one grid
is one 512-thread block (work <= 512 items), 128-thread blocks (<= 2048), 256-thread blocks
(<= 4096), 512-thread blocks (<= 8192) or 16 full blocks looping over the rest.

Rows of 8 KB (bf16 hidden 4096: 1024 LL lanes, 512 Lamport units) at counts that put each
op's grid in every one of those bands; the counts are uneven, zeros included, and come from
the host and from device memory (then the grid is sized by the buffers' capacity). Every case
is compared bit for bit with the reference on random data, into outputs filled with a poison
pattern first, so a lane that no thread of the smaller blocks covers shows. The same for
`quant_local` (csrc/lamport_quant_local.cu) against the reference quantizer: its block formats
(the unquantized gather's grid, a unit a thread) and its fp8 rows split over blocks (each part's
max published for the row's other parts).
"""

import pytest

from conftest import gpu_world, needs_gpus
from hybridcomm import Layout
from hybridcomm.check import Case, check_poisoned_cases, failures_of
from hybridcomm.quant.check import QuantCase, check_poisoned_quant_cases, quant_replay_check

pytestmark = [pytest.mark.gpu, needs_gpus(2)]

WORLD = gpu_world()
MAX_SMS = 16
ROW = (4096,)
# The largest count of a call (LL lanes = 1024 x rows; Lamport units = 512 x rows): 1 Lamport
# block; 128-thread blocks; 256-thread (LL) / 128-thread (Lamport); 512-thread (LL) / 256-thread
# (Lamport); capped (LL) / 512-thread (Lamport); capped.
ROWS = (1, 2, 3, 6, 12, 40)


def _counts(n: int, rows: int) -> tuple[int, ...]:
    """n counts whose largest is rows: uneven, the last member with none."""
    return tuple(rows if i == 0 else (rows // (i + 1) if i < n - 1 else 0) for i in range(n)) if n > 1 else (rows,)


def _cases() -> list[Case]:
    cases = []
    tp = Layout(WORLD, attn_tp=2)
    for device_sizes in (False, True):
        for rows in ROWS:
            if not device_sizes:  # (one message: no counts)
                cases.append(Case("all_reduce", Layout(WORLD), (rows,), row_shape=ROW, dtype="bfloat16",
                                  data="randn", seed=len(cases)))
            for op in ("all_gather_v", "reduce_scatter_v"):
                cases.append(Case(op, Layout(WORLD), _counts(WORLD, rows), row_shape=ROW, dtype="bfloat16",
                                  data="randn", device_sizes=device_sizes, seed=len(cases)))
            for lay in (Layout(WORLD), tp):
                for op in ("gather_tokens", "scatter_tokens"):
                    cases.append(Case(op, lay, _counts(lay.attn_dp, rows), row_shape=ROW, dtype="bfloat16",
                                      data="randn", device_sizes=device_sizes, seed=len(cases)))
    return cases


@pytest.mark.timeout(600)
@pytest.mark.parametrize("table", ["one_shot", "two_shot", "bulk", "lamport"])
def test_grids_of_every_block_size_match_the_reference(pool, table):
    cases = _cases()
    per_rank = pool(WORLD, "cuda").run(check_poisoned_cases, cases, "auto", "sums", table, MAX_SMS, timeout=600)
    failures = failures_of(cases, per_rank)
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:30])


# quant_local's fp8 rows of 7168 (896 bf16 units, 1792 fp32) split over blocks where every part
# gets one (max_sms 16: 1-2 rows in 7 parts of 128 threads, 3-4 in 4 of 256, 5-8 in 2 of 512),
# a full block a row beyond.
WIDE = (7168,)


def _quant_cases() -> list[QuantCase]:
    """quant_local (attention TP 2: partial rows): the block formats at every band of ROWS, fp8
    rows split into parts of every block size and not split."""
    lay = Layout(WORLD, attn_tp=2)
    shapes = [(fmt, ROW, "bfloat16", ROWS) for fmt in ("fp8_block128", "nvfp4")]
    shapes += [("fp8", WIDE, "bfloat16", ROWS), ("fp8", WIDE, "float32", (1, 2))]
    return [QuantCase(Case("gather_tokens", lay, _counts(lay.attn_dp, rows), row_shape=shape, dtype=dtype,
                           data="randn", device_sizes=device_sizes, seed=i), fmt, scale_tensor=device_sizes)
            for i, (fmt, shape, dtype, rows, device_sizes) in enumerate(
                (f, sh, dt, r, d) for f, sh, dt, rs in shapes for r in rs for d in (False, True))]


@pytest.mark.timeout(600)
def test_quant_local_on_every_block_size_and_split_rows_match_the_reference_quantizer(pool):
    qcases = _quant_cases()
    per_rank = pool(WORLD, "cuda").run(check_poisoned_quant_cases, qcases, "auto", "quant_local", "all", MAX_SMS,
                                       timeout=600)
    failures = [f"rank {r}: {q.describe()}: {detail}" for r, res in enumerate(per_rank)
                for q, (detail, _, _) in zip(qcases, res) if detail]
    failures += [f"rank {r}: {q.describe()}: ran {ran}" for r, res in enumerate(per_rank)
                 for q, (_, _, ran) in zip(qcases, res) if ran != "nvlink/quant_local"]
    failures += [f"{q.describe()}: ranks hold different bits" for i, q in enumerate(qcases)
                 if len({res[i][1] for res in per_rank}) > 1]  # gather_tokens: every rank the same
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:30])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("own_counts", [False, True], ids=["all-counts", "own-count"])
def test_split_fp8_rows_in_graph_replays_with_new_counts(pool, own_counts):
    """One graph, replayed with random counts of 0-2 rows per DP group (a grid of 2 rows x 7 parts
    per group): every part's published max carries its replay's flag, never an older one."""
    lay = Layout(WORLD, attn_tp=2)
    case = Case("gather_tokens", lay, (1,) * lay.attn_dp, row_shape=WIDE, dtype="bfloat16", data="randn",
                device_sizes=True)
    per_rank = pool(WORLD, "cuda").run(quant_replay_check, QuantCase(case, "fp8"), 8, 2, 7, "quant_local",
                                       own_counts, timeout=600)
    failures = [f"rank {r}: {f}" for r, res in enumerate(per_rank) for f in res["failures"]]
    assert not failures, "\n".join(failures[:20])
    for it in range(8):  # every rank holds the same gathered bits
        assert len({res["digests"][it] for res in per_rank}) == 1, f"replay {it}"
