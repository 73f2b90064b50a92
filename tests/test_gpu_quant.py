"""GPU tests of the quantized gathers (csrc/quant_gather.cu); skipped without 2 GPUs.

On 4 GPUs every world-4 layout, on 2 GPUs every world-2 layout. Data and scales bit for
bit equal to the reference quantizer applied to the reference's unquantized result; for
the fused add + RMSNorm, to the reference quantizer applied to our own unquantized fused
output (its hidden-dimension sum runs in another order than torch's, so the normed rows
themselves may differ from the reference's in the last bit). Outputs are poisoned first.
"""

import pytest

from conftest import gpu_world, needs_gpus, needs_nccl
from hybridcomm import Layout
from hybridcomm.check import Case, communicator
from hybridcomm.quant import FORMATS
from hybridcomm.quant.check import (QuantCase, check_poisoned_quant_cases, quant_cases, quant_failures,
                                    quant_replay_check)

pytestmark = [pytest.mark.gpu, needs_gpus(2)]


def _members(q: QuantCase) -> int:
    return len(q.case.layout.group_ranks("world" if q.case.op == "gather_tokens" else q.case.group, 0))


def _run(pool, qcases, backend="auto", exact="own_norm", table="auto", algorithm=None):
    """algorithm: the nvlink algorithm every case of a group of several ranks must have run."""
    per_rank = pool(gpu_world(), "cuda").run(check_poisoned_quant_cases, qcases, backend, table, exact, timeout=600)
    failures = quant_failures(qcases, per_rank)
    if algorithm is not None:
        failures += [f"rank {r}: {q.describe()}: ran {a}" for r, res in enumerate(per_rank)
                     for q, (_, _, a) in zip(qcases, res) if a != f"nvlink/{algorithm}" and _members(q) > 1]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:30])


@pytest.mark.timeout(900)
def test_every_format_and_layout_bit_equal_to_the_quantized_reference(pool):
    qcases = [q for i, lay in enumerate(Layout.all_for_world(gpu_world()))
              for q in quant_cases(lay, dtypes=("bfloat16", "float32", "float16"), seed=100 + i)]
    _run(pool, qcases)


def model_qcases(hidden: int) -> list[QuantCase]:
    """Model hidden sizes, many rows, an empty DP group; DP-only and attention TP 2."""
    world = gpu_world()
    qcases = []
    for lay in (Layout(world), Layout(world, attn_tp=2)):
        for fmt in FORMATS:
            for sizes in [(130,) * lay.attn_dp, tuple([0] + [77] * (lay.attn_dp - 1)), (1,) * lay.attn_dp]:
                for fused in (False, True):
                    case = Case("gather_tokens", lay, sizes, row_shape=(hidden,), dtype="bfloat16", data="randn",
                                fused=fused, seed=len(qcases))
                    qcases.append(QuantCase(case, fmt, scale_tensor=True))
            qcases.append(QuantCase(Case("all_gather_v", lay, (40,) * world, row_shape=(hidden,), dtype="bfloat16",
                                         data="randn", seed=len(qcases)), fmt))
    return qcases


@pytest.mark.timeout(900)
@pytest.mark.parametrize("hidden", [4096, 7168])
def test_model_hidden_sizes_and_many_rows(pool, hidden):
    _run(pool, model_qcases(hidden))


@needs_nccl()
@pytest.mark.timeout(900)
def test_nccl_backend_within_the_format_bound(pool):
    world = gpu_world()
    qcases = [q for lay in (Layout(world), Layout(world, attn_tp=2))
              for q in quant_cases(lay, device_sizes=(False,), seed=200)]
    _run(pool, qcases, backend="nccl", exact="bound")


REPLAYS = [("gather_tokens", True, False), ("gather_tokens", False, False), ("gather_tokens", True, True),
           ("all_gather_v", True, False)]


def _replay_check(qcase: QuantCase, pdl: bool, *args) -> dict:
    """quant_replay_check with the kernel launched with PDL or without (csrc/pdl.cuh)."""
    nvlink = communicator(qcase.case.layout, "auto").backends["nvlink"]  # the one quant_replay_check uses
    saved, nvlink.pdl = nvlink.pdl, pdl
    try:
        return quant_replay_check(qcase, *args)
    finally:
        nvlink.pdl = saved


@pytest.mark.timeout(900)
@pytest.mark.parametrize("pdl", [True, False], ids=["pdl", "no_pdl"])
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("op,partial,fused", REPLAYS)
def test_graph_replays_with_new_device_counts(pool, fmt, op, partial, fused, pdl):
    world = gpu_world()
    for lay in (Layout(world), Layout(world, attn_tp=2)):
        n = world if op == "all_gather_v" else lay.attn_dp
        case = Case(op, lay, (1,) * n, row_shape=(512,), dtype="bfloat16", data="randn", partial=partial,
                    fused=fused, device_sizes=True)
        per_rank = pool(world, "cuda").run(_replay_check, QuantCase(case, fmt), pdl, 12, 24, 5, timeout=600)
        failures = [f"rank {r}: {f}" for r, res in enumerate(per_rank) for f in res["failures"]]
        assert not failures, f"{lay.name}:\n" + "\n".join(failures[:20])
        for it in range(12):  # every rank holds the same gathered bits
            assert len({res["digests"][it] for res in per_rank}) == 1, f"{lay.name} replay {it}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_element_codes_equal_the_reference_on_every_fp32_input(fmt):
    """The kernels' e4m3 (the hardware conversion, two values an instruction) and e2m1 codes
    (csrc/quant.cuh, through csrc/element_codes.cu) against the reference quantizer's on all
    2^32 fp32 bit patterns: NaNs, infinities, subnormals and every half-ulp tie included."""
    import torch

    from hybridcomm import build
    from hybridcomm.quant.reference import e2m1_codes, to_e4m3

    lib = build.load()
    code = FORMATS[fmt].code
    chunk = 1 << 27
    out = torch.empty(chunk, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    mismatches = 0
    for start in range(0, 1 << 32, chunk):
        bits = torch.arange(start, start + chunk, dtype=torch.int64, device="cuda")
        v = torch.where(bits >= 1 << 31, bits - (1 << 32), bits).to(torch.int32).view(torch.float32)
        assert lib.hc_element_codes(int(code), v.data_ptr(), out.data_ptr(), chunk, stream) == 0
        want = to_e4m3(v).view(torch.uint8) if fmt != "nvfp4" else e2m1_codes(v)
        bad = (out != want).nonzero()
        if len(bad) and not mismatches:
            i = int(bad[0])
            first = f"bits {int(bits[i]):08x}: kernel {int(out[i]):#04x}, reference {int(want[i]):#04x}"
        mismatches += len(bad)
    assert mismatches == 0, f"{mismatches} of 2^32 inputs differ, first: {first}"
