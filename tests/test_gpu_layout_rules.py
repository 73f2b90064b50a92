"""GPU test of the selection tables' rules for one layout (algorithms.py: "scatter_tokens@tp4"):
on every layout of the world that has some, in the built-in table and in each packaged table
measured on a world of this size, a transition at a message size where those rules and the op's
own name different algorithms runs the layout's algorithm, with the reference backend's bits.
World 2, 4 or 8 (conftest.gpu_world; --gpu-ranks N on fewer GPUs); skipped with fewer, and where no table
has rules for a layout of that world."""

import json

import pytest

from conftest import gpu_world, needs_gpus
from hybridcomm import Layout, algorithms, table_file
from hybridcomm.check import Case
from test_gpu_two_step import _selected_and_reference

pytestmark = [pytest.mark.gpu, needs_gpus(2)]

WORLD = gpu_world()
HIDDEN = 4096
ROW_BYTES = HIDDEN * 2  # bf16


def _tables() -> dict[str, dict]:
    """Table name (as Communicator(table=...) takes it) -> its single-node rules."""
    tables = {"auto": algorithms.TABLE}
    for name in table_file.packaged():
        doc = json.loads(table_file.path_of(name).read_text())
        if doc["measured_on"]["world_size"] == WORLD:
            tables[name] = table_file.load(name)
    return tables


def _where_they_differ(table: dict, op: str, layout: Layout, largest: int = 4 << 20) -> list[tuple[int, str]]:
    """(message bytes, the layout's algorithm) at sizes next to each rule limit (the largest
    whole rows of every DP group within it, and one row more each) where the layout's rules and
    the op's own name different algorithms; one size per algorithm, up to `largest`."""
    own, shared = table[algorithms.layout_key(op, layout.attention_name)], table[op]
    step = ROW_BYTES * layout.attn_dp  # one more row in every DP group
    limits = sorted({r.max_bytes for r in own + shared if r.max_bytes is not None})
    sizes = sorted({n for b in limits for n in (b // step * step, b // step * step + step) if 0 < n <= largest})
    points = {}
    for nbytes in sizes:
        mine = algorithms.rule_at(own, nbytes)
        if mine.backend == "nvlink" and mine.algorithm != algorithms.rule_at(shared, nbytes).algorithm:
            points.setdefault(mine.algorithm, nbytes)
    return [(nbytes, algorithm) for algorithm, nbytes in points.items()]


CASES = [(name, op, lay, nbytes, algorithm)
         for name, table in _tables().items()
         for lay in Layout.all_for_world(WORLD) if lay.moe_tp == 1
         for op in ("gather_tokens", "scatter_tokens")
         if algorithms.layout_key(op, lay.attention_name) in table
         for nbytes, algorithm in _where_they_differ(table, op, lay)]


@pytest.mark.timeout(600)
@pytest.mark.skipif(not CASES, reason=f"no table has rules for one layout of world {WORLD}")
@pytest.mark.parametrize("table", sorted({case[0] for case in CASES}))
def test_a_layout_s_own_rules_choose_its_kernel_with_the_reference_s_bits(pool, table):
    mine = [case for case in CASES if case[0] == table]
    cases = [Case(op, lay, (nbytes // ROW_BYTES // lay.attn_dp,) * lay.attn_dp, row_shape=(HIDDEN,),
                  dtype="bfloat16", data="randn", seed=i)
             for i, (_, op, lay, nbytes, _) in enumerate(mine)]
    per_rank = pool(WORLD, "cuda").run(_selected_and_reference, cases, table, timeout=300)
    for rank, outcomes in enumerate(per_rank):
        for case, (_, _, _, nbytes, algorithm), (choice, got, want) in zip(cases, mine, outcomes):
            what = f"rank {rank}, table {table}: {case.describe()} ({nbytes} bytes)"
            assert choice == ("nvlink", algorithm), f"{what}: chose {choice}, the layout's rules say {algorithm}"
            assert got == want, f"{what}: bits differ from the reference backend"
