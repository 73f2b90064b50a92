"""Programmatic dependent launch (csrc/pdl.cuh): our kernel launched with PDL right after the
kernel that writes its input must still read that kernel's output (its griddepcontrol.wait
comes before any memory access), in CUDA graphs replayed with fresh inputs; and the
`bench pdl` report.

GPU tests: world 2, 4 or 8 (conftest.gpu_world); skipped with fewer than 2.
"""

import math

import pytest
import torch

from conftest import gpu_world, needs_gpus
from hybridcomm.bench.pdl import COLUMNS, pdl_table

DTYPE = torch.bfloat16
HIDDEN = 4096


# The ops fed by the GEMM: name -> (GEMM output shape, what runs on it). The chain runs two of
# our kernels after the GEMM, the second consuming the first's output (our kernel -> ours).
def _all_reduce(comm, x):
    return comm.all_reduce(x)


def _gather_tokens(comm, x):
    return comm.gather_tokens(x, [x.shape[0]] * comm.layout.attn_dp)


def _gather_then_all_reduce(comm, x):
    return comm.all_reduce(_gather_tokens(comm, x))


def _gather_tokens_fp8(comm, x):  # the quantized gather kernel (csrc/quant_gather.cu)
    return comm.gather_tokens(x, [x.shape[0]] * comm.layout.attn_dp, quant="fp8")


STEPS = {"all_reduce_2K": ((1, 1024), _all_reduce), "all_reduce_128K": ((16, HIDDEN), _all_reduce),
         "gather_tokens_1": ((1, HIDDEN), _gather_tokens), "gather_tokens_16": ((16, HIDDEN), _gather_tokens),
         "gather_tokens_16_then_all_reduce": ((16, HIDDEN), _gather_then_all_reduce),
         "gather_tokens_16_fp8": ((16, HIDDEN), _gather_tokens_fp8)}


def _bits(out) -> list[torch.Tensor]:
    """An op's result as bytes: a tensor, or the data and scales of QuantizedRows."""
    parts = [out] if isinstance(out, torch.Tensor) else [out.data, out.scales]
    return [p.contiguous().view(torch.uint8) for p in parts]


def gemm_then_op_replays(step: str, replays: int, seed: int) -> list[str]:
    """Worker entry (CUDA): capture "GEMM writes x -> our op(s) read x" with PDL on, replay it
    `replays` times with a fresh GEMM input (x poisoned with NaN before each replay), and
    compare each replay's output with the reference backend run on the x that replay wrote.
    Returns the mismatches."""
    import torch.distributed as dist

    from hybridcomm import Communicator, Layout

    (rows, cols), op = STEPS[step]
    layout = Layout(dist.get_world_size())
    ours = Communicator(layout, backend="nvlink")
    ours.backends["nvlink"].pdl = True
    reference = Communicator(layout, backend="reference")
    device = ours.device
    gen = torch.Generator(device=device).manual_seed(seed * 100 + dist.get_rank())
    a = torch.randn(rows, HIDDEN, dtype=DTYPE, device=device, generator=gen)
    w = torch.randn(HIDDEN, cols, dtype=DTYPE, device=device, generator=gen) / math.sqrt(HIDDEN)
    x = torch.empty(rows, cols, dtype=DTYPE, device=device)

    def produce_and_consume():
        torch.mm(a, w, out=x)  # cuBLAS: launched without PDL, never triggers its dependents
        return op(ours, x)

    from hybridcomm.check import capture

    graph, out = capture(produce_and_consume)
    failures = []
    if ours.last_choice.backend != "nvlink":
        failures.append(f"{step}: ran on {ours.last_choice.backend}, not our kernel ({ours.last_choice.reason})")
    for i in range(replays):
        a.normal_(generator=gen)
        x.fill_(float("nan"))  # read before the GEMM wrote it: NaN
        graph.replay()
        for got, want in zip(_bits(out), _bits(op(reference, x))):
            if not torch.equal(got, want):
                bad = (got != want).sum().item()
                failures.append(f"{step} replay {i}: {bad} of {got.numel()} bytes differ from the reference")
    torch.cuda.synchronize()
    del graph
    ours.close()
    return failures[:10]


@needs_gpus(2)
@pytest.mark.gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("step", list(STEPS))
def test_our_kernel_after_a_gemm_reads_what_the_gemm_wrote_over_graph_replays(pool, step):
    per_rank = pool(gpu_world(), "cuda").run(gemm_then_op_replays, step, 200, 3, timeout=500)
    failures = [f"rank {r}: {f}" for r, res in enumerate(per_rank) for f in res]
    assert not failures, "\n".join(failures[:20])


def test_the_pdl_table_has_one_row_per_record_with_the_saving():
    records = [{"mode": "graph", "producer": "gemm_16x4096x4096", "op": "all_reduce 2K", "kernel": "nvlink/one_shot",
                "producer_us": 9.5, "pdl_off_us": 16.0, "pdl_on_us": 15.0, "saving_us": 1.0},
               {"mode": "eager", "producer": "none", "op": "gather_tokens 1", "kernel": "nvlink/one_shot",
                "producer_us": None, "pdl_off_us": 8.0, "pdl_on_us": 6.0, "saving_us": 2.0}]
    results = {"layout": "dp2", "dtype": "torch.bfloat16", "hidden": HIDDEN, "calls": 40, "repeats": 7,
               "environment": {"gpu": "test"}, "records": records}
    lines = pdl_table(results).splitlines()
    rows = [line.split() for line in lines if not line.startswith("#")]
    assert len(rows) == len(records)
    names = [name for name, _, _ in COLUMNS]
    header = next(line for line in lines if "saving_us" in line).lstrip("# ").split()
    assert header == names
    # mode, producer and the kernel are one word each; the op label is two ("all_reduce 2K")
    for row, record in zip(rows, records):
        saving_pct = float(row[-1])
        assert saving_pct == pytest.approx(100 * record["saving_us"] / record["pdl_off_us"], abs=0.05)
        assert row[5] == ("-" if record["producer_us"] is None else f"{record['producer_us']:.2f}")
