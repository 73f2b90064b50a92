"""bench quant's bytes floor (hybridcomm.bench.quant_floor): the bf16 gather's time at the token
count that moves the quantized bytes, from the same run's records."""

import pytest

from hybridcomm.bench.quant_floor import floor_markdown, floor_rows, interpolate


def _record(layout, impl, tokens, us, case="balanced", fmt="fp8", hidden=4096):
    return {"layout": layout, "format": fmt, "hidden": hidden, "case": case, "tokens_per_dp": [tokens] * 2,
            "impl": impl, "us": us}


def _results():
    bf16 = {64: 6.0, 128: 8.0, 256: 14.0}
    records = [_record("dp2", "hc_bf16", t, us) for t, us in bf16.items()]
    records += [_record("dp2", "hybridcomm", 256, 10.0), _record("dp2", "hybridcomm", 64, 5.0),
                _record("dp2", "hc_quant", 256, 11.0),
                _record("dp2", "hybridcomm", 256, 99.0, case="imbalanced"),  # only balanced counts
                _record("tp2", "hc_bf16", 128, 1.0), _record("tp2", "hc_bf16", 256, 2.0),
                _record("tp2", "hybridcomm", 256, 3.0)]  # attention TP 2: partial rows travel too
    return {"dtype": "torch.bfloat16", "environment": {}, "records": records}


def test_interpolate_is_linear_between_the_nearest_points_and_none_outside():
    curve = [(1, 2.0), (3, 6.0), (7, 6.0)]
    assert interpolate(curve, 2) == pytest.approx(4.0)
    assert interpolate(curve, 5) == pytest.approx(6.0)
    assert interpolate(curve, 3) == pytest.approx(6.0)
    assert interpolate(curve, 0.5) is None and interpolate(curve, 8) is None


def test_floor_is_the_bf16_time_of_the_quantized_bytes_on_pure_dp_layouts_only():
    rows = floor_rows(_results())
    # 64 tokens of fp8 are 32 bf16 tokens' bytes: below the curve, no floor; tp2 left out.
    assert [(r["layout"], r["tokens"]) for r in rows] == [("dp2", 256)]
    (row,) = rows
    as_bf16 = 256 * 4100 / 8192  # fp8 rows of hidden 4096: 4096 codes + a 4-byte scale
    assert row["as_bf16_tokens"] == pytest.approx(as_bf16)
    assert row["floor"] == pytest.approx(8.0 + 6.0 * (as_bf16 - 128) / 128)
    assert (row["bf16"], row["quantized"]) == (14.0, 10.0)
    table = floor_markdown(_results())
    assert "| dp2 | 4096 | fp8 | 256 | 14.00 | 10.00 | 0.71 | 128.1 | 8.01 | 0.57 | 1.25 |" in table


def test_no_section_without_a_pure_dp_layout():
    results = _results()
    results["records"] = [r for r in results["records"] if r["layout"] == "tp2"]
    assert floor_markdown(results) == ""


def test_bench_quant_markdown_ends_with_the_floor():
    from hybridcomm.bench.quant import quant_markdown

    text = quant_markdown(_results())
    assert "## Bytes floor (attention TP 1, balanced)" in text
    assert text.index("## dp2, hidden 4096, fp8") < text.index("## Bytes floor")
