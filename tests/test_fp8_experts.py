"""fp8 experts fed by the fp8 gather (model/fp8.py, model/quantized.py): the GEMM against its
definition, and the quantized decoder on 4 gloo ranks against the engines' path and the
unquantized reference. (The GPU variants, _scaled_mm and our kernel vs NCCL: test_gpu_fp8_experts.py.)"""

from dataclasses import replace

import pytest
import torch

from hybridcomm.model import CommTransitions
from hybridcomm.model.fp8 import FP8_GEMMS, Fp8Weight, fp8_gemm, reference_gemm, scaled_mm_gemm
from hybridcomm.quant import quantize

# Relative row error of a quantized decoder step (tiny config, 2 layers) against the unquantized
# reference. Measured on CPU: fp8 0.035-0.066, nvfp4 0.07-0.125 (route_margin pins the experts,
# so this is the arithmetic of the formats, not flipped routes); a wrongly applied scale gives O(1).
REL_BOUND = {"fp8": 0.1, "nvfp4": 0.2, "fp8_block128": 0.1}

# layout name, moe_tp, tokens per DP group (uneven, with an empty group where there are several)
LAYOUTS_4 = [("dp4", 1, [3, 0, 5, 1]), ("dp2xtp2", 1, [4, 0]), ("dp2xtp2", 2, [3, 6]), ("tp4", 1, [7])]


def _operands(m: int, k: int, n: int, seed: int = 0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn((m, k), generator=g) * 3.0
    w = torch.randn((k, n), generator=g) * k ** -0.5
    return quantize(a.to(device), "fp8"), Fp8Weight.quantize(w.to(device)), a, w


@pytest.mark.parametrize("m", [0, 1, 5, 33])
def test_reference_gemm_is_the_dequantized_product(m):
    q, w8, _, _ = _operands(m, 64, 40)
    out = fp8_gemm(q.data, q.scales, w8)
    assert out.shape == (m, 40) and out.dtype == torch.bfloat16 and w8.data.shape == (48, 64)
    expected = q.dequantize(torch.float64) @ w8.dequantize().double()
    # one rounding to bf16 (2^-8 relative) on an fp32 sum of exact products
    torch.testing.assert_close(out.double(), expected, rtol=2 ** -8, atol=1e-5)
    assert FP8_GEMMS["cpu"] is reference_gemm


def test_weight_quantization_is_per_output_column_within_the_fp8_bound():
    _, w8, _, w = _operands(1, 64, 40)
    amax = w.abs().amax(dim=0)
    torch.testing.assert_close(w8.scales[0, :40], amax / 448.0, rtol=0, atol=0)
    assert (w8.data[40:].float() == 0).all()
    err = (w8.dequantize() - w).abs()
    assert (err <= 2 ** -4 * w.abs() + 2 ** -10 * w8.scales[0, :40]).all()


def test_scaled_mm_on_cpu_matches_the_reference():
    """The argument layout of the CUDA path (column-major weight, (M,1) x (1,N) scales), checked
    on a CPU build that has a rowwise _scaled_mm (torch 2.13 does)."""
    q, w8, _, _ = _operands(21, 64, 40, seed=1)
    try:
        out = scaled_mm_gemm(q.data, q.scales, w8)
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"this torch has no CPU rowwise _scaled_mm: {e}")
    # both round one fp32 result to bf16; their fp32 sums may differ in the last places
    torch.testing.assert_close(out.float(), reference_gemm(q.data, q.scales, w8).float(), rtol=2 ** -7, atol=1e-4)


def test_fp8_gemm_rejects_bad_operands():
    q, w8, a, w = _operands(4, 64, 40)
    with pytest.raises(ValueError, match="^a: expected float8_e4m3fn"):
        fp8_gemm(a.to(torch.bfloat16), q.scales, w8)
    with pytest.raises(ValueError, match="^a_scales: expected float32"):
        fp8_gemm(q.data, q.scales.view(1, -1), w8)
    with pytest.raises(ValueError, match="^w: the fp8 GEMM needs"):
        Fp8Weight.quantize(w[:40])
    with pytest.raises(ValueError, match="no fp8 GEMM for device type 'meta'"):
        fp8_gemm(q.data.to("meta"), q.scales.to("meta"), w8)


def test_e2m1_values_from_the_bits_match_the_table():
    """nvfp4 dequantize computes code values arithmetically (capturable in a CUDA graph)."""
    from hybridcomm.quant.rows import E2M1_VALUES, e2m1_values

    values = e2m1_values(torch.arange(16, dtype=torch.uint8))
    table = torch.tensor(E2M1_VALUES)
    assert torch.equal(values, table) and torch.equal(values.signbit(), table.signbit())


def test_unknown_quant_format_raises():
    from hybridcomm.model import ModelConfig, ModelWeights
    from hybridcomm.model.quantized import QuantizedMoe

    with pytest.raises(ValueError, match="^quant: expected one of"):
        QuantizedMoe(ModelWeights.generate(replace(ModelConfig.tiny(), layers=1)), "int4")


# -- the decoder on gloo ranks ---------------------------------------------------------------------
class EngineTransitions(CommTransitions):
    """What engines run before their fp8 MoE, composed here from plain steps: all-reduce over
    attention TP, add + RMSNorm, quantize this DP group's rows, all-gather the data and the
    scales over DP (as bytes, padded to the largest group: gloo's all-gather takes equal sizes).
    On CUDA the NCCL backend runs the same sequence (backends/nccl.py)."""

    def gather(self, o_partial, residual, norm_weight, eps):
        from hybridcomm.norm import add_rms_norm

        reduced = self.comm.all_reduce(o_partial, group="attn_tp")
        normed, residual_out = add_rms_norm(reduced, residual, norm_weight, eps)
        g = self.quant_args["global_scale"]
        q = quantize(normed, self.quant_args["quant"], None if g is None else torch.tensor([g]))
        return q.map_rows(lambda t: _gather_padded(t, list(self.dp_sizes), self.comm.groups["attn_dp"])), residual_out


def _gather_padded(t: torch.Tensor, counts: list[int], group) -> torch.Tensor:
    from hybridcomm import collectives

    if group.size == 1:
        return t
    most = max(counts)
    padded = t.new_zeros((most,) + tuple(t.shape[1:]))
    padded[: t.shape[0]] = t
    out = t.new_empty((group.size * most,) + tuple(t.shape[1:]))
    collectives.all_gather_single(out, padded, group=group.pg)
    return torch.cat([out[i * most: i * most + n] for i, n in enumerate(counts)])


def quantized_decoder(layout_name: str, moe_tp: int, dp_sizes: list[int], quant: str, dtype: str,
                      paths: tuple[str, str]) -> dict:
    """On every rank: one decode step of the tiny decoder with `quant` on two paths, each
    compared with the unquantized single-process reference (on this device, in `dtype`), and
    with each other. Paths: "ours" (the Communicator's choice: our kernel on CUDA, the reference
    backend on CPU), "nccl" (backend="nccl", CUDA), "engine" (EngineTransitions)."""
    import torch.distributed as dist

    from hybridcomm.bench.layer import _communicator, _errors, _worker_device
    from hybridcomm.layout import Layout
    from hybridcomm.model import (DistributedDecoder, ModelConfig, ModelWeights, cut_batch, decode_step,
                                  dtype_from_name, make_batch, reference_forward)

    device = _worker_device()
    cfg = ModelConfig.tiny(dtype_from_name(dtype))
    layout = replace(Layout.parse(layout_name), moe_tp=moe_tp)
    rank = dist.get_rank()
    weights = ModelWeights.generate(cfg, device)
    batch = make_batch(cfg, dp_sizes, device)
    expected = reference_forward(cfg, weights, batch)[layout.coords(rank).attn_dp_rank]
    part = cut_batch(batch, cfg, layout, rank)
    outs = {}
    for path in paths:
        comm = _communicator(layout, "nccl" if path == "nccl" else "auto", device)  # kept by the worker
        decoder = DistributedDecoder(cfg, weights, comm, quant=quant)
        if path == "engine":
            q = decoder.quantized
            transitions = EngineTransitions(comm, dp_sizes, q.gather_args())
            outs[path] = decode_step(decoder.weights, part, transitions, decoder.route_offsets(dp_sizes, device),
                                     q.experts)
        else:
            outs[path] = decoder.forward(part, dp_sizes)
    first, second = (outs[p] for p in paths)
    return {"rows": first.shape[0], "expected_rows": expected.shape[0],
            "rel": {p: _errors(o, expected)[1] for p, o in outs.items()},
            "between": _errors(first, second)[1], "equal": torch.equal(first, second),
            "finite": all(bool(torch.isfinite(o).all()) for o in outs.values())}


def check_quantized_decoder(results: list[dict], quant: str, exact: bool) -> None:
    for rank, r in enumerate(results):
        assert r["rows"] == r["expected_rows"] and r["finite"], f"rank {rank}: {r}"
        for path, rel in r["rel"].items():
            assert rel <= REL_BOUND[quant], f"rank {rank}: {path} is {rel:.3g} from the reference"
        if exact:
            assert r["equal"], f"rank {rank}: the two paths differ ({r['between']:.3g})"
        else:
            assert r["between"] <= REL_BOUND[quant], f"rank {rank}: the paths differ by {r['between']:.3g}"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("layout_name, moe_tp, dp_sizes", LAYOUTS_4)
def test_fp8_decoder_equals_the_engine_path_in_fp32(pool, layout_name, moe_tp, dp_sizes):
    """fp32: the reference backend's quantized gather and the engines' sequence produce the same
    bytes (fp32 sums, the same norm and quantizer), so the same fp8 GEMMs give the same bits."""
    results = pool(4).run(quantized_decoder, layout_name, moe_tp, dp_sizes, "fp8", "float32",
                          ("ours", "engine"), timeout=150)
    check_quantized_decoder(results, "fp8", exact=True)
    assert any(r["rows"] == 0 for r in results) == (0 in dp_sizes)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("quant", ["fp8", "nvfp4"])
def test_quantized_decoder_bf16_is_within_the_format_bound(pool, quant):
    """bf16 with attention TP: the engines' all-reduce rounds to bf16 before the residual add
    (ours rounds once, after it), so the two paths differ within the format's error."""
    results = pool(4).run(quantized_decoder, "dp2xtp2", 1, [3, 6], quant, "bfloat16", ("ours", "engine"),
                          timeout=150)
    check_quantized_decoder(results, quant, exact=False)


@pytest.mark.timeout(120)
def test_bench_layer_cpu_quantized(pool):
    from hybridcomm.bench.layer import bench_layer, format_layer_table

    result = bench_layer(["dp4"], [[2, 0, 3, 1]], world_size=4, device="cpu", backends=["reference"],
                         steps=1, warmup=1, dtype="float32", config="tiny", pool=pool(4), quants=[None, "fp8"])
    plain, fp8 = result["results"]
    assert (plain["quant"], fp8["quant"]) == (None, "fp8")
    assert plain["backends"][0]["max_rel_error"] <= 1e-5
    assert 1e-4 < fp8["backends"][0]["max_rel_error"] <= REL_BOUND["fp8"]
    lines = format_layer_table(result).splitlines()
    assert "quant" in lines[0] and any(" fp8 " in line for line in lines[2:])
