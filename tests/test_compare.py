"""Benchmark runs side by side: two, or a change between two main runs (hybridcomm.bench.compare,
scripts/compare_results.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from hybridcomm.bench.compare import bracketed, compare_markdown, paired, verdict


def _run(records):
    return {"environment": {"date": "2026-11-23"}, "records": records}


BEFORE = _run([
    {"op": "all_reduce", "bytes": 2048, "impl": "hc_one_shot", "us": 4.0, "busbw_GBps": 0.5},
    {"op": "all_reduce", "bytes": 2048, "impl": "nccl", "us": 10.0, "busbw_GBps": 0.2},
    {"op": "all_reduce", "bytes": 4096, "impl": "hc_one_shot", "us": 5.0, "busbw_GBps": 0.8},
    {"op": "all_reduce", "bytes": 8192, "impl": "hc_one_shot", "us": 6.0, "busbw_GBps": 1.3},
])
AFTER = _run([
    {"op": "all_reduce", "bytes": 2048, "impl": "hc_one_shot", "us": 3.0, "busbw_GBps": 0.7},
    {"op": "all_reduce", "bytes": 2048, "impl": "nccl", "us": 11.0, "busbw_GBps": 0.19},
    {"op": "all_reduce", "bytes": 4096, "impl": "hc_one_shot", "us": 5.5, "busbw_GBps": 0.7},
    {"op": "all_gather_v", "bytes": 2048, "impl": "hc_one_shot", "us": 2.0, "busbw_GBps": 1.0},
])


def test_records_pair_by_every_field_but_the_time_and_what_derives_from_it():
    pairs, unpaired = paired(BEFORE, AFTER)
    got = {(case["bytes"], case["impl"]): (b, a) for case, b, a in pairs}
    assert got == {(2048, "hc_one_shot"): (4.0, 3.0), (2048, "nccl"): (10.0, 11.0), (4096, "hc_one_shot"): (5.0, 5.5)}
    assert unpaired == 2  # 8192 only before, all_gather_v only after


def test_the_table_gives_after_over_before_and_a_median_per_impl():
    text = compare_markdown(BEFORE, AFTER, {"hc_one_shot"})
    assert "| hc_one_shot | 2 | 0.925 | 0.750 | 1.100 |" in text  # median of 0.75 and 1.1
    assert "| all_reduce | 2048 | hc_one_shot | 4.00 | 3.00 | 0.750 |" in text
    assert "nccl" not in text.split("| op |")[1]
    assert compare_markdown(BEFORE, AFTER, {"missing"}) == "(no records in common)\n"


def test_the_script_reads_two_result_files(tmp_path: Path):
    for name, run in (("before.json", BEFORE), ("after.json", AFTER)):
        (tmp_path / name).write_text(json.dumps(run))
    script = Path(__file__).parent.parent / "scripts" / "compare_results.py"
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "before.json"), str(tmp_path / "after.json"),
                          "--impl", "nccl"], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(Path(__file__).parent.parent / "src"))).stdout
    assert "| all_reduce | 2048 | nccl | 10.00 | 11.00 | 1.100 |" in out


MAIN_AGAIN = _run([
    {"op": "all_reduce", "bytes": 2048, "impl": "hc_one_shot", "us": 4.2, "busbw_GBps": 0.5},
    {"op": "all_reduce", "bytes": 2048, "impl": "nccl", "us": 12.0, "busbw_GBps": 0.2},
    {"op": "all_reduce", "bytes": 4096, "impl": "hc_one_shot", "us": 4.9, "busbw_GBps": 0.8},
])


def test_a_change_counts_only_beyond_both_main_runs_by_more_than_their_drift():
    assert verdict(4.0, 3.0, 4.2) == "faster"  # 1.0 below both, the mains 0.2 apart
    assert verdict(10.0, 11.0, 12.0) == ""  # between the two main runs
    assert verdict(5.0, 5.5, 4.9) == "slower"  # 0.5 above both, the mains 0.1 apart
    assert verdict(5.0, 4.7, 5.5) == ""  # below both, but by less than the mains differ
    rows = {(case["bytes"], case["impl"]): (m1, c, m2) for case, m1, c, m2 in bracketed(BEFORE, AFTER, MAIN_AGAIN)}
    assert rows == {(2048, "hc_one_shot"): (4.0, 3.0, 4.2), (2048, "nccl"): (10.0, 11.0, 12.0),
                    (4096, "hc_one_shot"): (5.0, 5.5, 4.9)}


def test_the_script_reads_a_change_between_two_main_runs(tmp_path: Path):
    for name, run in (("main_1.json", BEFORE), ("change.json", AFTER), ("main_2.json", MAIN_AGAIN)):
        (tmp_path / name).write_text(json.dumps(run))
    script = Path(__file__).parent.parent / "scripts" / "compare_results.py"
    out = subprocess.run([sys.executable, str(script), *(str(tmp_path / n) for n in
                                                          ("main_1.json", "change.json", "main_2.json"))],
                         capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(Path(__file__).parent.parent / "src"))).stdout
    assert "| hc_one_shot | 1 | 1 | 0 |" in out  # 2048 faster, 4096 slower
    assert "| nccl | 0 | 0 | 1 |" in out
    assert "| all_reduce | 2048 | hc_one_shot | 4.00 | 3.00 | 4.20 | 0.750 | 0.714 | 1.050 | faster |" in out
