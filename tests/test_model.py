"""The reference MoE decoder: distributed over 4 gloo ranks == single process; layer bench."""

from dataclasses import replace

import pytest
import torch

from hybridcomm.layout import Layout
from hybridcomm.model import ModelConfig, Shard

# layout -> uneven tokens per DP group, each with an empty group or a single token
TOKENS = {"dp4": [3, 0, 5, 1], "dp2xtp2": [4, 1], "tp4": [5]}


def decoder_vs_reference(layout_name: str, moe_tp: int, dp_sizes: list[int]) -> dict:
    import torch.distributed as dist

    from hybridcomm import Communicator
    from hybridcomm.model import (DistributedDecoder, ModelWeights, cut_batch, make_batch,
                                  reference_forward)

    cfg = ModelConfig.tiny()
    layout = replace(Layout.parse(layout_name), moe_tp=moe_tp)
    rank = dist.get_rank()
    weights = ModelWeights.generate(cfg)
    batch = make_batch(cfg, dp_sizes)
    expected = reference_forward(cfg, weights, batch)[layout.coords(rank).attn_dp_rank]
    decoder = DistributedDecoder(cfg, weights, Communicator(layout, device="cpu"))
    out = decoder.forward(cut_batch(batch, cfg, layout, rank), dp_sizes)
    return {"shape": tuple(out.shape), "expected_shape": tuple(expected.shape),
            "error": (out - expected).abs().max().item() if out.numel() else 0.0,
            "finite": bool(torch.isfinite(out).all()), "mean_abs": out.abs().mean().item() if out.numel() else None}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("moe_tp", [1, 2, 4])
@pytest.mark.parametrize("layout_name", sorted(TOKENS))
def test_decoder_matches_reference(pool, layout_name, moe_tp):
    results = pool(4).run(decoder_vs_reference, layout_name, moe_tp, TOKENS[layout_name], timeout=100)
    for rank, r in enumerate(results):
        assert r["shape"] == r["expected_shape"], f"rank {rank}: {r}"
        assert r["finite"], f"rank {rank}: non-finite output"
        assert r["error"] <= 1e-5, f"rank {rank}: max abs error {r['error']:.3g}"
        if r["shape"][0]:
            assert r["mean_abs"] > 0.1, f"rank {rank}: output is (nearly) zero: {r}"
    assert any(r["shape"][0] == 0 for r in results) == (0 in TOKENS[layout_name])


@pytest.mark.parametrize("layout, field", [
    (Layout(4, attn_tp=4), None),
    (Layout(8, attn_tp=8), "heads"),
    (Layout(16, moe_tp=1), "experts"),
    (Layout(64, moe_tp=64), "intermediate"),
])
def test_divisibility(layout, field):
    cfg = ModelConfig.tiny()  # heads 4, experts 8, intermediate 32
    if field is None:
        assert Shard.for_rank(cfg, layout, 3) == Shard(3, 4, 6, 8, 0, 32)
        return
    with pytest.raises(ValueError, match=rf"ModelConfig\.{field}=\d+ is not divisible .*{layout.name}"):
        Shard.for_rank(cfg, layout, 0)


def test_bad_config():
    with pytest.raises(ValueError, match="top_k"):
        replace(ModelConfig.tiny(), top_k=9)
    with pytest.raises(ValueError, match="max_cache"):
        replace(ModelConfig.tiny(), max_cache=1)


def test_reference_is_per_token():
    """DP groups only partition the requests: the reference gives a group's rows the same
    values whether the other groups are in the batch or not (the layer bench relies on it)."""
    from hybridcomm.model import Batch, ModelWeights, make_batch, make_dp_batch, reference_forward

    cfg = ModelConfig.tiny()
    weights = ModelWeights.generate(cfg)
    together = reference_forward(cfg, weights, make_batch(cfg, [4, 2]))
    alone = reference_forward(cfg, weights, Batch([make_dp_batch(cfg, 2, 1)]))
    torch.testing.assert_close(alone[0], together[1], rtol=0, atol=1e-5)


@pytest.mark.timeout(120)
def test_bench_layer_cpu(pool):
    from hybridcomm.bench.layer import bench_layer, format_layer_table

    result = bench_layer(["dp2xtp2"], [[3, 1]], world_size=4, device="cpu", backends=["reference"],
                         steps=2, warmup=1, dtype="float32", config="tiny", pool=pool(4))
    (run,) = result["results"]
    (b,) = run["backends"]
    assert b["backend"] == "reference" and run["tokens_per_dp"] == [3, 1]
    assert 0 < b["step_us"] < float("inf")
    assert b["max_abs_error"] <= 1e-5
    assert {"date", "torch", "device"} <= set(result)
    table = format_layer_table(result)
    assert "reference" in table and "dp2xtp2" in table
