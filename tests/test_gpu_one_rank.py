"""Groups of one rank in CUDA graphs with device-side sizes: every op of world 1, and the
one-rank groups inside world 2 (attn_tp of DP2, attn_dp of TP2). Nothing travels there. The
Communicator sends such calls to the reference backend, which reads no count under capture
(backends/reference.py capacity_sizes), so a captured graph replays with new counts. Before,
they went to NCCL, which cannot read device-side sizes inside a capture, and failed there.
Each op is captured once and replayed with random counts (zeros included) and random data,
bit for bit against the oracle (the fused norm within one rounding), as test_gpu.py does for
the groups of several ranks."""

import pytest

from conftest import gpu_count, needs_gpus
from test_gpu import REPLAY_OPS
from hybridcomm import Layout
from hybridcomm.check import Case, cases_for_layout, check_poisoned_cases, failures_of, replay_check

pytestmark = [pytest.mark.gpu, needs_gpus(1)]

REPLAYS = 100
LAYOUTS = [Layout(1)] + ([Layout(2), Layout(2, attn_tp=2)] if gpu_count() >= 2 else [])


def _templates(layout: Layout) -> list[Case]:
    """REPLAY_OPS on the groups of one rank of `layout` (the transitions only where the world is one)."""
    out = []
    for op, group, partial, fused in REPLAY_OPS:
        transition = op.endswith("tokens")
        if len(layout.group_ranks("world" if transition else group, 0)) != 1:
            continue
        count = layout.attn_dp if transition else 1
        out.append(Case(op, layout, (0,) * count, group, row_shape=(256,), dtype="bfloat16", data="randn",
                        partial=partial, fused=fused, device_sizes=True))
    return out


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: lay.name)
def test_one_rank_groups_replay_with_new_device_side_sizes(pool, layout):
    templates = _templates(layout)
    assert templates, layout  # every layout here has a group of one rank
    for template in templates:
        for rank, result in enumerate(pool(layout.world_size, "cuda").run(replay_check, template, REPLAYS, 6,
                                                                          timeout=600)):
            what = f"{template.op} {template.group} partial={template.partial} fused={template.fused}"
            assert result["mismatches"] == 0, f"{what} rank {rank}: {result['failures']}"


def test_nccl_backend_at_world_1_matches_the_oracle(pool):
    """Every op of world 1 on the forced NCCL backend, whose transitions with one DP group are one
    all-reduce (backends/nccl.py one_all_reduce; test_gpu.py covers TP2 / TP4 on 2 or 4 GPUs)."""
    cases = cases_for_layout(Layout(1), dtypes=("bfloat16",), data="randn", row_shape=(64,), seed=5)
    per_rank = pool(1, "cuda").run(check_poisoned_cases, cases, "nccl", "none", timeout=300)
    failures = failures_of(cases, per_rank)
    assert not failures, "\n".join(failures[:20])
