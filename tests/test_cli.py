import json
import subprocess
import sys

import pytest

from hybridcomm.cli import main


def test_info_prints_the_rank_table_and_workspace(capsys):
    assert main(["info", "--layout", "dp2xtp2"]) == 0
    out = capsys.readouterr().out
    assert "layout dp2xtp2" in out and "nvlink workspace" in out


def test_info_shows_the_rules_each_op_runs_by_on_the_layout(capsys):
    """A transition with rules for the layout shows those (tp4's scatter: two_step from 1 MiB), the
    others the op's; --table shows another table's."""
    assert main(["info", "--layout", "tp4"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[-8:]}
    assert "<= 1 M: nvlink/one_shot_lamport; <= 16 M: nvlink/two_step" in lines["scatter_tokens"]
    assert "(tp4's own)" in lines["scatter_tokens"] and "own" not in lines["gather_tokens"]
    assert "(a group of any size)" in lines["all_reduce"]
    assert main(["info", "--layout", "tp4", "--table", "lamport"]) == 0
    out = capsys.readouterr().out
    assert "(table: lamport)" in out and "scatter_tokens      larger: nvlink/one_shot_lamport\n" in out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world, totals", [(2, "264 cases + 40 quantized"), (8, "1056 cases + 160 quantized")])
def test_check_passes_in_its_own_processes(world, totals):
    run = subprocess.run([sys.executable, "-m", "hybridcomm", "check", "--world", str(world), "--quick", "--device",
                          "cpu"], capture_output=True, text=True, timeout=280)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"dp{world} " in run.stdout and f"tp{world} " in run.stdout
    assert f"PASS: {totals} x {world} ranks" in run.stdout  # fp8 gathers of every layout (--quick)


def test_check_reports_a_quantized_gather_that_failed_on_one_rank(capsys):
    from hybridcomm.cli import _report_check, check_world_quant

    qcases = check_world_quant(2, quick=True)[:2]
    per_rank_quant = [[("", "bits"), ("", "bits")], [("", "bits"), ("data: 3 bytes differ", "other bits")]]
    assert _report_check([], [[], []], qcases, per_rank_quant) == 1
    out = capsys.readouterr().out
    assert "quantized    1 passed, 1 failed" in out and "FAIL rank 1: " in out and "data: 3 bytes differ" in out
    assert "hold different bits" in out


@pytest.mark.timeout(300)
def test_bench_ops_on_cpu_writes_json_and_markdown(tmp_path):
    out = tmp_path / "ops.json"
    run = subprocess.run([sys.executable, "-m", "hybridcomm", "bench", "ops", "--world", "2", "--device", "cpu",
                          "--sizes", "2048,8192", "--out", str(out)], capture_output=True, text=True, timeout=280)
    assert run.returncode == 0, run.stdout + run.stderr
    records = json.loads(out.read_text())["records"]
    assert {(r["op"], r["bytes"]) for r in records} == {(op, b) for op in ("all_reduce", "all_gather_v",
                                                                          "reduce_scatter_v") for b in (2048, 8192)}
    assert out.with_suffix(".md").exists() and "reference" in run.stdout


def test_unknown_subcommand_is_rejected():
    with pytest.raises(SystemExit):
        main(["frobnicate"])
