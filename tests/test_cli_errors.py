"""Every user mistake on the command line: exit code 2, one line on stderr, no traceback."""

import argparse
import subprocess
import sys

import pytest
import torch

from hybridcomm.cli import main, parser
from hybridcomm.layout import Layout

MISTAKES = {
    # argv: words the one line must contain
    ("info", "--layout", "foo"): ["--layout", "cannot parse layout 'foo'", "world=6,attn_tp=3,moe_tp=2"],
    ("info", "--layout", "tp4,moe_tp3"): ["--layout", "moe_tp=3 does not divide world_size=4", "[1, 2, 4]"],
    ("info", "--layout", "world=6,attn=3"): ["unknown key 'attn'"],
    ("info", "--workspace-bytes", "-5"): ["--workspace-bytes", "'-5'"],
    ("info", "--workspace-bytes", "20"): ["--workspace-bytes", "multiple of 16"],
    ("bench", "ops", "--sizes", "1X"): ["--sizes", "2K or 4M", "'1X'"],
    ("bench", "ops", "--sizes", "2K,,4K"): ["--sizes", "comma-separated"],
    ("bench", "ops", "--max-sms", "8,0"): ["--max-sms", "positive integer", "'0'"],
    ("bench", "ops", "--device", "cpu", "--max-sms", "8"): ["--max-sms", "needs --device cuda"],
    ("bench", "layer", "--layout", "dp2xtp2", "--layout", "dp2"): ["same world size", "dp2xtp2 (4 ranks)", "dp2 (2 ranks)"],
    ("bench", "layer", "--steps", "0"): ["--steps", "positive integer", "'0'"],
    ("bench", "layer", "--tokens", "4,x"): ["--tokens", "'x'"],
    ("bench", "layer", "--backends", "fast"): ["--backends", "'fast'"],
    ("bench", "layer", "--quant", "fp8,int4"): ["--quant", "'int4'", "none"],
    ("bench", "layer", "--device", "cpu", "--backends", "nccl"): ["--backends nccl needs --device cuda"],
    ("bench", "layer", "--device", "cpu", "--layout", "world=6,attn_tp=3"): ["heads", "attn_tp=3"],
    ("bench", "model", "--config", "qwen3-30b-a3b,gpt2"): ["--config", "unknown config 'gpt2'", "deepseek-v3"],
    ("bench", "model", "--tokens", "1,even"): ["--tokens", "1,4,64:1,uneven"],
    ("bench", "model", "--device", "cpu", "--backends", "reference,nccl_symm"): ["--backends nccl_symm needs --device cuda"],
    ("check", "--world", "0"): ["--world", "positive integer"],
    ("check", "--device", "cpu", "--backend", "nccl", "--world", "2"): ["--backend nccl needs --device cuda"],
    ("check", "--device", "gpu"): ["--device", "invalid choice"],
    ("check", "--table", "fastest"): ["--table", "'fastest' is not a named table", "4xH200"],
    ("tune", "--tolerance", "5"): ["--tolerance", "[0, 1)", "'5'"],
    ("tune", "--from", "no_such_results.json"): ["--from no_such_results.json", "cannot read"],
}


def _run(argv, capsys):
    try:
        code = main(list(argv))
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr()


@pytest.mark.parametrize("argv", list(MISTAKES), ids=[" ".join(a) for a in MISTAKES])
def test_a_user_mistake_is_one_line_on_stderr_and_exit_code_2(argv, capsys):
    code, out = _run(argv, capsys)
    assert code == 2, out
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hybridcomm"), out.err
    for word in MISTAKES[argv]:
        assert word in lines[0], lines[0]
    assert out.out == ""


@pytest.mark.parametrize("argv", [("check", "--device", "cuda", "--world", "2"),
                                  ("bench", "ops", "--device", "cuda", "--world", "2"),
                                  ("bench", "layer", "--device", "cuda"),
                                  ("bench", "pdl"),
                                  ("check", "--backend", "nvlink"),
                                  ("tune", "--world", "2")])
def test_no_gpu_is_one_line_too(argv, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, out = _run(argv, capsys)
    assert code == 2 and len(out.err.strip().splitlines()) == 1, out.err
    assert "cuda" in out.err


@pytest.mark.timeout(120)
def test_the_installed_entry_point_prints_no_traceback():
    run = subprocess.run([sys.executable, "-m", "hybridcomm", "bench", "layer", "--layout", "dp2xtp2",
                          "--layout", "dp2"], capture_output=True, text=True, timeout=100)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().count("\n") == 0, run.stderr


def _actions(p: argparse.ArgumentParser, prog=""):
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _actions(sub, f"{prog} {name}")
        elif not isinstance(action, argparse._HelpAction):
            yield prog, action


def test_every_flag_has_help_text():
    missing = [f"{prog} {'/'.join(a.option_strings)}" for prog, a in _actions(parser()) if a.option_strings and not a.help]
    assert not missing


def test_layouts_of_any_world_parse_and_round_trip_through_their_name():
    lay = Layout.parse("world=6,attn_tp=3,moe_tp=2")
    assert (lay.world_size, lay.attn_tp, lay.moe_tp) == (6, 3, 2)
    assert Layout.parse(lay.name) == lay
    assert Layout.parse("world=8") == Layout(8)
    for world in (1, 2, 3, 4, 6, 8):
        for lay in Layout.all_for_world(world):
            assert Layout.parse(lay.name) == lay
            assert Layout.parse(f"world={world},attn_tp={lay.attn_tp},moe_tp={lay.moe_tp}") == lay


def test_max_sms_takes_a_list():
    assert parser().parse_args(["bench", "ops", "--max-sms", "8,16,32"]).max_sms == [8, 16, 32]


def test_sizes_accept_suffixes(capsys):
    args = parser().parse_args(["bench", "ops", "--sizes", "2048,2K,1M,1MiB"])
    assert args.sizes == [2048, 2048, 1 << 20, 1 << 20]
    assert [lay.name for lay in parser().parse_args(["bench", "transitions", "--layouts", "dp4,tp4,moe_tp2"]).layouts] \
        == ["dp4", "tp4,moe_tp2"]
