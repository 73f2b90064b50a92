"""GPU tests of the fp8 experts (model/fp8.py, model/quantized.py); skipped without 2 GPUs.

- torch._scaled_mm (rowwise) against the fp32 reference GEMM: the same value up to the order
  of the fp32 sum, so within one bf16 rounding.
- Our quantized gather vs the NCCL path (add + norm, quantize, all-gather data and scales) feeding
  the same fp8 GEMM: where the two gathers delivered the same bytes, the GEMM's output rows are
  the same bits (a row of the output depends only on its own row of the input). The bytes
  themselves may differ in some rows: our kernel's RMSNorm sums the hidden dimension in another
  order than torch's (last-bit differences, which can move an e4m3 rounding or the row's amax
  and so its scale), and with attention TP NCCL sums in bf16 where we sum in fp32.
- The whole decoder step, ours and NCCL, within the format's error of the bf16 reference.
On 4 GPUs the world-4 layouts, on 2 GPUs world 2.
"""

import pytest

from conftest import gpu_world, needs_gpus, needs_nccl
from test_fp8_experts import LAYOUTS_4, check_quantized_decoder, quantized_decoder

pytestmark = [pytest.mark.gpu, needs_gpus(2)]

LAYOUTS_2 = [("dp2", 1, [3, 0]), ("dp2", 2, [1, 6]), ("tp2", 1, [5])]
# (no TP8: the tiny decoder has 4 heads)
LAYOUTS_8 = [("dp8", 1, [3, 0, 5, 1, 2, 0, 4, 1]), ("dp4xtp2", 2, [3, 6, 0, 2]), ("dp2xtp4", 1, [4, 0])]


def _layouts():
    return {2: LAYOUTS_2, 4: LAYOUTS_4, 8: LAYOUTS_8}[gpu_world()]


def scaled_mm_vs_reference(rows: list[int], hidden: int, cols: int) -> list[str]:
    import torch

    from hybridcomm.model.fp8 import FP8_GEMMS, Fp8Weight, fp8_gemm, reference_gemm, scaled_mm_gemm
    from hybridcomm.quant import quantize

    failures = []
    if FP8_GEMMS["cuda"] is not scaled_mm_gemm:
        failures.append("FP8_GEMMS['cuda'] is not _scaled_mm")
    g = torch.Generator(device="cuda").manual_seed(7)
    w8 = Fp8Weight.quantize(torch.randn((hidden, cols), device="cuda", generator=g) * hidden ** -0.5)
    for m in rows:
        q = quantize(torch.randn((m, hidden), device="cuda", generator=g) * 3.0, "fp8")
        out = fp8_gemm(q.data, q.scales, w8)
        ref = reference_gemm(q.data, q.scales, w8)[:, :cols]
        if out.shape != (m, cols) or out.dtype != torch.bfloat16:
            failures.append(f"m={m}: got {out.dtype} {tuple(out.shape)}")
            continue
        try:
            # One bf16 rounding (rtol), plus the accumulation: Hopper's fp8 MMA keeps fewer mantissa
            # bits than fp32 while it sums K products (measured: 1.1e-3 absolute at K = 4096 on
            # outputs up to a few units), so the absolute slack scales with the largest output.
            slack = 2 ** -9 * ref.abs().max().item() if m else 0.0
            torch.testing.assert_close(out.float(), ref.float(), rtol=2 ** -7, atol=max(slack, 1e-4))
        except AssertionError as e:
            failures.append(f"m={m}: {str(e).splitlines()[:4]}")
    return failures


@pytest.mark.timeout(300)
def test_scaled_mm_matches_the_reference_gemm(pool):
    # hidden 4096 -> the bench config's router + experts columns on DP2 (8200, padded to 8208)
    per_rank = pool(gpu_world(), "cuda").run(scaled_mm_vs_reference, [0, 1, 7, 64, 300], 4096, 8200, timeout=240)
    failures = [f"rank {r}: {f}" for r, fs in enumerate(per_rank) for f in fs]
    assert not failures, "\n".join(failures)


def gathers_into_one_gemm(layout_name: str, dp_sizes: list[int], hidden: int) -> dict:
    """gather_tokens(residual, norm, quant="fp8") on our kernel and on NCCL, the same inputs;
    both results through the same fp8 GEMM."""
    import torch
    import torch.distributed as dist

    from hybridcomm import Layout
    from hybridcomm.bench.layer import _communicator
    from hybridcomm.model.fp8 import Fp8Weight, fp8_gemm

    layout = Layout.parse(layout_name)
    rank, dp = dist.get_rank(), layout.coords(dist.get_rank()).attn_dp_rank
    g = torch.Generator(device="cuda").manual_seed(11)  # the same draws on every rank ...
    residual = torch.randn((sum(dp_sizes), hidden), device="cuda", generator=g).bfloat16()
    weight = (1 + 0.1 * torch.randn(hidden, device="cuda", generator=g)).bfloat16()
    w8 = Fp8Weight.quantize(torch.randn((hidden, 512), device="cuda", generator=g) * hidden ** -0.5)
    g.manual_seed(100 + rank)  # ... then this rank's partial attention output
    start = sum(dp_sizes[:dp])
    x = torch.randn((dp_sizes[dp], hidden), device="cuda", generator=g).bfloat16()
    mine = residual[start: start + dp_sizes[dp]]
    outs = {}
    for backend in ("auto", "nccl"):
        comm = _communicator(layout, backend, x.device)  # kept by the worker
        q, _ = comm.gather_tokens(x, dp_sizes, residual=mine, norm_weight=weight, quant="fp8")
        outs[backend] = (q, fp8_gemm(q.data, q.scales, w8))
    (qa, ya), (qb, yb) = outs["auto"], outs["nccl"]
    same_in = (qa.data.view(torch.uint8) == qb.data.view(torch.uint8)).all(dim=1) & (qa.scales == qb.scales).all(dim=1)
    same_out = (ya.view(torch.int16) == yb.view(torch.int16)).all(dim=1)
    diff = (qa.dequantize() - qb.dequantize()).norm(dim=1) / qb.dequantize().norm(dim=1).clamp_min(1e-30)
    return {"rows": qa.data.shape[0], "same_bytes": int(same_in.sum()),
            "same_bytes_same_out": bool(same_out[same_in].all()),
            "max_rel_diff": diff.max().item() if diff.numel() else 0.0}


@needs_nccl()
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", ["dp", "tp"])
def test_same_gathered_bytes_give_the_same_gemm_bits(pool, case):
    world = gpu_world()
    tp = (f"dp{world // 2}xtp2", [29, 0] + [3] * (world // 2 - 2)) if world > 2 else ("tp2", [29])
    layout, sizes = {"dp": (f"dp{world}", [37, 0] + [5] * (world - 2)), "tp": tp}[case]
    per_rank = pool(world, "cuda").run(gathers_into_one_gemm, layout, sizes, 4096, timeout=240)
    for rank, r in enumerate(per_rank):
        assert r["rows"] == sum(sizes), f"rank {rank}: {r}"
        assert r["same_bytes_same_out"], f"rank {rank}: equal gathered rows gave different GEMM bits: {r}"
        # rows whose bytes differ: last-bit differences before the quantizer (see the docstring)
        assert r["max_rel_diff"] <= 2 ** -3, f"rank {rank}: the two gathers differ by more than fp8 rounding: {r}"
        if case == "dp":  # no TP sum: only the norm's summation order differs, so most rows must match
            assert r["same_bytes"] > r["rows"] // 2, f"rank {rank}: {r}"


@needs_nccl()
@pytest.mark.timeout(600)
@pytest.mark.parametrize("quant", ["fp8", "nvfp4"])
def test_quantized_decoder_ours_vs_nccl(pool, quant):
    world = gpu_world()
    for layout_name, moe_tp, dp_sizes in _layouts():
        results = pool(world, "cuda").run(quantized_decoder, layout_name, moe_tp, dp_sizes, quant, "bfloat16",
                                          ("ours", "nccl"), timeout=240)
        check_quantized_decoder(results, quant, exact=False)
