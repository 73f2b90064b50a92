"""GPU tests of the row kernels' grid shapes (csrc/launch.cuh grid_rows): with host counts the
grid covers the largest count (all_gather_v, reduce_scatter_v, scatter_tokens) or all rows
(gather_tokens), not the buffers' capacity; with device counts, the capacity as before. (DP-only
gather_tokens runs all_gather_v's kernel.)

Rows of 8 KB (1024 LL lanes, 512 Lamport units: one Lamport block per row) with uneven counts,
zeros included, so grids of one block and of several blocks differ from the capacity-sized
ones; one token per rank makes the Lamport all_gather_v a one-block grid (no last-block count).
Each case is compared bit for bit with the reference on random data, LL and Lamport forced,
host and device counts.
"""

import pytest

from conftest import gpu_world, needs_gpus
from hybridcomm import Layout
from hybridcomm.check import Case, check_poisoned_cases, failures_of

pytestmark = [pytest.mark.gpu, needs_gpus(2)]

WORLD = gpu_world()
ROW = (4096,)  # bf16: 8 KB


def _uneven(n: int) -> list[tuple[int, ...]]:
    """Counts per member: one each; all rows on the first; none on the first, several elsewhere."""
    return [(1,) * n, (3,) + (0,) * (n - 1), (0,) + tuple(2 * i + 1 for i in range(1, n))]


def _cases() -> list[Case]:
    cases = []
    for device_sizes in (False, True):
        for sizes in _uneven(WORLD):
            for op in ("all_gather_v", "reduce_scatter_v", "gather_tokens", "scatter_tokens"):
                cases.append(Case(op, Layout(WORLD), sizes, row_shape=ROW, dtype="bfloat16", data="randn",
                                  device_sizes=device_sizes, seed=len(cases)))
        tp = Layout(WORLD, attn_tp=2)
        for sizes in _uneven(tp.attn_dp) if tp.attn_dp > 1 else [(1,), (3,)]:
            for op in ("gather_tokens", "scatter_tokens"):
                cases.append(Case(op, tp, sizes, row_shape=ROW, dtype="bfloat16", data="randn",
                                  device_sizes=device_sizes, seed=len(cases)))
    return cases


@pytest.mark.timeout(600)
@pytest.mark.parametrize("table", ["one_shot", "lamport"])
def test_row_kernels_sized_by_their_counts_match_the_reference(pool, table):
    cases = _cases()
    per_rank = pool(WORLD, "cuda").run(check_poisoned_cases, cases, "auto", "sums", table, timeout=600)
    failures = failures_of(cases, per_rank)
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:30])
