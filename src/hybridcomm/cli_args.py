"""Command-line values: parsing, checking, and one-line errors (argparse conventions).

Every user mistake ends as one line on stderr, `hybridcomm <command>: error: <what>`, and
exit code 2: malformed values through the argparse types below, mistakes that need several
arguments or the machine (no GPU, layouts of different worlds) through `UsageError`.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

from .layout import Layout
from .quant import FORMATS as QUANT_FORMATS

BYTE_SUFFIXES = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
                 "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}
BENCH_BACKENDS = ("auto", "reference", "nccl", "nccl_symm", "nvlink")
CPU_BACKENDS = ("auto", "reference")  # on CPU every op runs on the reference backend


class UsageError(Exception):
    """A user mistake found after parsing; main() prints it as one line and exits 2."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but an error is one line (no usage block): `prog: error: message`."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _type(fn, what: str):
    """An argparse type from fn(text) that raises ValueError with a readable message."""
    def parse(text: str):
        try:
            return fn(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = what
    return parse


def _positive(text: str) -> int:
    if not re.fullmatch(r"\s*\d+\s*", text) or int(text) < 1:
        raise ValueError(f"expected a positive integer, got {text!r}")
    return int(text)


def _count(text: str) -> int:
    if not re.fullmatch(r"\s*\d+\s*", text):
        raise ValueError(f"expected a non-negative integer, got {text!r}")
    return int(text)


def _bytes(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in BYTE_SUFFIXES:
        raise ValueError(f"expected a byte count such as 2048, 2K or 4M, got {text!r}")
    n = int(m.group(1)) * BYTE_SUFFIXES[m.group(2).upper()]
    if n < 1:
        raise ValueError(f"expected a positive byte count, got {text!r}")
    return n


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:  # also refuses nan
        raise ValueError(f"expected a fraction in [0, 1), e.g. 0.05, got {text!r}")
    return value


def _workspace_bytes(text: str) -> int:
    n = _bytes(text)
    if n % 16:
        raise ValueError(f"expected a positive multiple of 16 bytes, got {text!r} = {n}")
    return n


def _list(item, text: str) -> list:
    items = [t for t in text.split(",")]
    if not text.strip() or any(not t.strip() for t in items):
        raise ValueError(f"expected a comma-separated list, got {text!r}")
    return [item(t) for t in items]


def _names(valid, what: str):
    """A parser of comma-separated names, each one of `valid`."""
    def parse(text: str) -> list[str]:
        names = _list(str.strip, text)
        bad = [n for n in names if n not in valid]
        if bad:
            raise ValueError(f"unknown {what}(s) {bad}; valid are {list(valid)}")
        return names
    return parse


positive_int = _type(_positive, "positive int")
byte_count = _type(_bytes, "bytes")
fraction = _type(_fraction, "fraction")
workspace_bytes = _type(_workspace_bytes, "bytes")
byte_list = _type(lambda t: _list(_bytes, t), "byte list")
count_list = _type(lambda t: _list(_count, t), "count list")
positive_list = _type(lambda t: _list(_positive, t), "list of positive ints")
layout = _type(Layout.parse, "layout")
def _layouts(text: str) -> list[Layout]:
    """'dp2xtp2,dp4,tp4,moe_tp2' (a ',moe_tpN' belongs to the layout before it), or layouts
    separated by ';' (needed for the key=value form)."""
    if ";" in text or "=" in text:
        return [Layout.parse(t) for t in text.split(";")]
    names: list[str] = []
    for item in _list(str.strip, text):
        if item.startswith("moe_tp") and names:
            names[-1] += "," + item
        else:
            names.append(item)
    return [Layout.parse(n) for n in names]


def _table(text: str) -> str:
    """A named table, a packaged table or a table file: checked here, loaded by each Communicator."""
    from .algorithms import NAMED_TABLES, node_tables
    from .table_file import packaged

    node_tables(text)  # a bad name or file raises ValueError saying what is wrong
    is_path = text not in NAMED_TABLES and text not in packaged()
    return str(Path(text).resolve()) if is_path else text  # worker processes may start elsewhere


layout_list = _type(_layouts, "layouts")
table = _type(_table, "table")
backend_list = _type(_names(BENCH_BACKENDS, "backend"), "backends")
quant_list = _type(_names(QUANT_FORMATS, "format"), "quant formats")
layer_quant_list = _type(_names(("none", *QUANT_FORMATS), "format"), "quant formats")  # none: 16-bit


def check_device(device: str, world: int, share_gpus: bool = False) -> str:
    """`device`, or UsageError if it cannot run `world` ranks here (share_gpus: several ranks a GPU)."""
    if device != "cuda":
        if share_gpus:
            raise UsageError("--share-gpus needs --device cuda")
        return device
    if not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA GPU is visible here (torch.cuda.is_available() is False); "
                         "use --device cpu")
    if torch.cuda.device_count() < world and not share_gpus:
        raise UsageError(f"--device cuda: {world} ranks need {world} GPUs (one per rank), "
                         f"{torch.cuda.device_count()} visible (--share-gpus: ranks take turns on them, "
                         f"a correctness check only)")
    return device


def check_gpu_run(need: str, world: int, layouts: list[Layout] | None = None, share_gpus: bool = False) -> None:
    """UsageError unless `world` GPU ranks can run here (share_gpus: several a GPU) and `layouts`
    (if given) have `world` ranks; `need` is the sentence said when there is no GPU."""
    if not torch.cuda.is_available():
        raise UsageError(need)
    if layouts is not None and same_world(layouts) != world:
        raise UsageError(f"--layouts have {layouts[0].world_size} ranks, --world is {world}")
    check_device("cuda", world, share_gpus)


def check_backend(backend: str, device: str, flag: str = "--backend") -> None:
    if device == "cpu" and backend not in CPU_BACKENDS:
        raise UsageError(f"{flag} {backend} needs --device cuda (GPUs); on CPU every op runs on the "
                         f"reference backend ({flag} {' or '.join(CPU_BACKENDS)})")


def same_world(layouts: list[Layout]) -> int:
    worlds = {lay.world_size for lay in layouts}
    if len(worlds) > 1:
        names = ", ".join(f"{lay.name} ({lay.world_size} ranks)" for lay in layouts)
        raise UsageError(f"--layout: all layouts of one run need the same world size, got {names}")
    return worlds.pop()


def report(command: str, error: Exception) -> int:
    print(f"hybridcomm {command}: error: {error}", file=sys.stderr)
    return 2
