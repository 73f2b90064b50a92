"""The selection table's quantized rules against the measurements they come from."""

import json
from collections import defaultdict
from pathlib import Path

import pytest

from hybridcomm.algorithms import choose
from hybridcomm.quant import FORMATS

RESULTS = Path(__file__).resolve().parents[1] / "results" / "4xH200" / "quant_4xH200.json"
BASELINES = ("nccl_q", "nccl_symm_q")  # the quantize-then-NCCL paths (bench/quant.py)


@pytest.mark.skipif(not RESULTS.exists(), reason=f"{RESULTS} is not in this checkout")
def test_quantized_rules_pick_the_faster_path_at_every_measured_point():
    points: dict = defaultdict(dict)
    for r in json.loads(RESULTS.read_text())["records"]:
        points[(r["layout"], r["format"], r["hidden"], tuple(r["tokens_per_dp"]))][r["impl"]] = r["us"]
    checked = 0
    for (layout, fmt, hidden, tokens), us in points.items():
        if "hc_quant" not in us or not any(b in us for b in BASELINES):
            continue
        faster = "nvlink" if us["hc_quant"] < min(us[b] for b in BASELINES if b in us) else "nccl"
        nbytes = sum(tokens) * FORMATS[fmt].row_bytes(hidden)  # the gathered quantized rows
        got = choose("gather_tokens_quant", nbytes, lambda algorithm: None).backend
        assert got == faster, f"{layout} {fmt} h{hidden} {tokens} ({nbytes} bytes): table {got}, measured {us}"
        checked += 1
    assert checked >= 10
