"""The selection table's quantized rules against the measurements they come from."""

import json
from collections import defaultdict
from pathlib import Path

import pytest

from hybridcomm.algorithms import choose
from hybridcomm.quant import FORMATS
from hybridcomm.tune import TOLERANCE

RESULTS = Path(__file__).resolve().parents[1] / "results" / "4xH200" / "quant_4xH200.json"
BASELINES = ("nccl_q", "nccl_symm_q")  # the quantize-then-NCCL paths (bench/quant.py)
# our kernels, each forced (bench/quant.py)
OURS = ("hc_quant", "hc_quant_one_hop", "hc_quant_lamport", "hc_quant_local")


@pytest.mark.skipif(not RESULTS.exists(), reason=f"{RESULTS} is not in this checkout")
def test_quantized_rules_pick_the_faster_path_at_every_measured_point():
    """Backend: nvlink where the fastest of our measured kernels beats the NCCL paths. Algorithm:
    where the table's algorithm was measured beside another of ours, it is within the tuner's
    tolerance of the fastest (points where it was not measured are not evidence either way)."""
    points: dict = defaultdict(dict)
    for r in json.loads(RESULTS.read_text())["records"]:
        points[(r["layout"], r["format"], r["hidden"], tuple(r["tokens_per_dp"]))][r["impl"]] = r["us"]
    checked = 0
    for (layout, fmt, hidden, tokens), us in points.items():
        ours = {i: us[i] for i in OURS if i in us}
        if not ours or not any(b in us for b in BASELINES):
            continue
        faster = "nvlink" if min(ours.values()) < min(us[b] for b in BASELINES if b in us) else "nccl"
        nbytes = sum(tokens) * FORMATS[fmt].row_bytes(hidden)  # the gathered quantized rows
        got = choose("gather_tokens_quant", nbytes, lambda algorithm: None)
        what = f"{layout} {fmt} h{hidden} {tokens} ({nbytes} bytes): table {got}, measured {us}"
        assert got.backend == faster, what
        chosen = f"hc_{got.algorithm}"
        if got.backend == "nvlink" and chosen in ours and len(ours) > 1:
            assert ours[chosen] <= min(ours.values()) * (1 + TOLERANCE), what
        checked += 1
    assert checked >= 10

