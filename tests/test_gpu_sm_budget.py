"""Communicator(max_sms=...): our kernels on fewer blocks than the GPU has SMs, against the oracle,
and inside a CUDA green context of few SMs. There, without max_sms, grids sized to the whole GPU
wait for blocks that cannot be resident and end in PeerTimeout, and a peer of the rank that
timed out can return wrong rows without an error (scripts/green_context_probe.py; runs 17-18 in
results/shared_1xH100/)."""

import pytest
import torch

from conftest import gpu_world, needs_gpus
from hybridcomm import Layout
from hybridcomm.abi import MAX_BLOCKS
from hybridcomm.check import Case, cases_for_layout, check_cases, close_communicators, communicator
from hybridcomm.quant.check import QuantCase, check_quant_cases

pytestmark = [pytest.mark.gpu, needs_gpus(2)]

WORLD = gpu_world()
LAYOUTS = [Layout(WORLD), Layout(WORLD, attn_tp=2)]
GREEN_SMS = 8  # a green context this small holds none of the default grids (up to one block per SM)


def _cases() -> list[Case]:
    """Every op of the layouts, small and at sizes that take every block of a default grid."""
    cases = []
    for i, lay in enumerate(LAYOUTS):
        cases += cases_for_layout(lay, dtypes=("bfloat16",), data="randn", row_shape=(64,),
                                  device_sizes=(False, True), seed=300 + i)
        for op, rows in [("all_reduce", 300), ("gather_tokens", 150), ("scatter_tokens", 100),
                         ("all_gather_v", 150), ("reduce_scatter_v", 100)]:
            sizes = (rows,) if op == "all_reduce" else (rows,) * (lay.attn_dp if "tokens" in op else WORLD)
            cases.append(Case(op, lay, sizes, row_shape=(4096,), dtype="bfloat16", data="randn", seed=len(cases)))
        cases.append(Case("gather_tokens", lay, (150,) * lay.attn_dp, row_shape=(4096,), dtype="bfloat16",
                          data="randn", fused=True, seed=399))
    return cases


def _quant_cases() -> list[QuantCase]:
    return [QuantCase(Case("gather_tokens", lay, (130,) * lay.attn_dp, row_shape=(7168,), dtype="bfloat16",
                           data="randn", fused=fused, seed=400 + fused), fmt, scale_tensor=True)
            for lay in LAYOUTS for fused in (False, True) for fmt in ("fp8", "nvfp4")]


def _check(cases, qcases, tables, max_sms) -> list[str]:
    """Worker: every case on every table with this max_sms; what failed."""
    failures = []
    try:
        for table in tables:
            outcomes = check_cases(cases, "auto", "sums", table=table, max_sms=max_sms)
            failures += [f"{table}: {o.case}: {o.detail}" for o in outcomes if not o.ok]
            quant = check_quant_cases(qcases, "auto", table, "own_norm", max_sms=max_sms)
            failures += [f"{table}: {q.describe()}: {detail}" for q, (detail, _) in zip(qcases, quant) if detail]
    finally:
        close_communicators(max_sms)
    return failures


def _in_a_green_context(sms, cases, qcases, tables, max_sms) -> list[str]:
    """Worker: the calls on the green context's own stream. Not on torch's default stream with
    the green context current: creating an NCCL communicator (the Communicator's process groups)
    makes another context current (the device's primary one, by its timing), and from then on the
    default stream's work runs on every SM (measured on 2x H200: scripts/green_context_stages.py,
    results/2xH200/main_2026-11-28/); a green context's stream stays on its SMs whatever is
    current."""
    from torch.cuda import green_contexts

    if not green_contexts.SUPPORTED:
        return ["skip: this torch has no green contexts"]
    green = green_contexts.GreenContext.create(num_sms=sms, device_id=torch.cuda.current_device())
    stream = green.Stream()
    try:
        with torch.cuda.stream(stream):
            return _check(cases, qcases, tables, max_sms)
    finally:
        stream.synchronize()


def _assert_none(per_rank):
    failures = [f"rank {r}: {f}" for r, fs in enumerate(per_rank) for f in fs]
    if any(f.startswith("skip:") for fs in per_rank for f in fs):
        pytest.skip(per_rank[0][0])
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:30])


@pytest.mark.timeout(900)
@pytest.mark.parametrize("max_sms", [1, 3])
def test_every_algorithm_on_a_few_sms_matches_the_oracle(pool, max_sms):
    tables = ["auto", "one_shot", "two_shot", "bulk", "lamport", "pipelined", "quant_ll", "quant_one_hop",
              "quant_local"]
    _assert_none(pool(WORLD, "cuda").run(_check, _cases(), _quant_cases(), tables, max_sms, timeout=900))


@pytest.mark.timeout(900)
def test_in_a_green_context_of_few_sms_every_call_completes_with_max_sms(pool):
    tables = ["auto", "two_shot", "bulk", "pipelined", "quant_ll", "quant_one_hop"]
    per_rank = pool(WORLD, "cuda").run(_in_a_green_context, GREEN_SMS, _cases(), _quant_cases(), tables, GREEN_SMS,
                                       timeout=900)
    _assert_none(per_rank)


def _blocks(layout, max_sms) -> int:
    try:
        return communicator(layout, max_sms=max_sms).backends["nvlink"].workspace.max_blocks
    finally:
        close_communicators(max_sms)


def _blocks_of_different_requests() -> int:
    import torch.distributed as dist

    return _blocks(Layout(WORLD), 2 + dist.get_rank())


def test_the_ranks_use_the_smallest_max_sms_and_never_more_than_the_sms(pool):
    run = pool(WORLD, "cuda").run
    assert run(_blocks_of_different_requests) == [2] * WORLD  # a kernel's grid is the same on every rank
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert run(_blocks, Layout(WORLD), 10_000) == [min(sms, MAX_BLOCKS)] * WORLD
