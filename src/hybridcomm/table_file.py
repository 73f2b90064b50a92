"""Selection tables as data files: the JSON `hybridcomm tune` writes and `Communicator(table=...)`
reads (a path, or the name of a file in src/hybridcomm/tables/ such as "4xH200").

    {"format": "hybridcomm-table/1",
     "measured_on": {"gpu": ..., "world_size": ..., "sources": [{"file": ..., "environment": {...}}]},
     "method": {...}, "not_measured": [ops],
     "rules": {key: [{"max_bytes": int | null, "backend": "nvlink" | "nccl", "algorithm": name}, ...]},
     "evidence": {key: [{"bytes": ..., "chosen": ..., "us": {candidate: µs}}, ...]}}

A key is an op, or a transition's op and a layout ("scatter_tokens@tp4": algorithms.py, rules for
one layout). Only "format" and "rules" are read; the rest says where the rules came from. Rules
are checked like algorithms.TABLE's (a known op, a layout of the canonical attention name, a
registry algorithm on nvlink, max_bytes strictly increasing, the last one null). An op the file
has no rules for keeps the built-in table's (algorithms.TABLE), rules for single layouts
included; an op it has rules for keeps none of them: a file states what was measured, nothing more.
"""

from __future__ import annotations

import json
from pathlib import Path

from .algorithms import LAYOUT_SEPARATOR, TABLE, Rule, key_op, rules_key, with_rules
from .layout import Layout
from .ops import OPS

FORMAT = "hybridcomm-table/1"
TABLES_DIR = Path(__file__).parent / "tables"
BACKENDS = ("nvlink", "nccl")


class TableFileError(ValueError):
    """A table file that cannot be used; the message names the file and the faulty rule."""


def rules_to_json(table: dict[str, tuple[Rule, ...]]) -> dict[str, list[dict]]:
    return {op: [{"max_bytes": r.max_bytes, "backend": r.backend, "algorithm": r.algorithm} for r in rules]
            for op, rules in table.items()}


def packaged() -> list[str]:
    """Names of the tables shipped in src/hybridcomm/tables/."""
    return sorted(p.stem for p in TABLES_DIR.glob("*.json"))


def machine_name(ranks_in_node: int, gpu_name: str) -> str:
    """The packaged table's name for a node of `ranks_in_node` GPUs called `gpu_name`
    (torch.cuda.get_device_name: "NVIDIA H200" -> "4xH200")."""
    return f"{ranks_in_node}x{gpu_name.split()[-1]}" if gpu_name.strip() else ""


def for_machine(ranks_in_node: int, gpu_name: str) -> str | None:
    """The packaged table measured on this machine shape, if there is one: thresholds depend on
    how many GPUs share the node (on 2 GPUs a one-shot moves no more bytes than a two-step)."""
    name = machine_name(ranks_in_node, gpu_name)
    return name if name in packaged() else None


def path_of(source: str | Path) -> Path:
    """A packaged table's name or a path -> the file (TableFileError if neither exists)."""
    if isinstance(source, str) and source in packaged():
        return TABLES_DIR / f"{source}.json"
    path = Path(source)
    if not path.is_file():
        from .algorithms import NAMED_TABLES

        raise TableFileError(f"table: {str(source)!r} is not a named table ({', '.join(NAMED_TABLES)}), a "
                             f"packaged table ({', '.join(packaged()) or 'none'}) or a table file")
    return path


def load(source: str | Path) -> dict[str, tuple[Rule, ...]]:
    """The single-node table of a file (or packaged name): its rules over algorithms.TABLE."""
    path = path_of(source)
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise TableFileError(f"table file {path}: not JSON ({e})") from None
    return with_rules(TABLE, parse(doc, str(path)))


def parse(doc, where: str) -> dict[str, tuple[Rule, ...]]:
    """A table document's rules, checked (TableFileError naming `where` and the rule)."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise TableFileError(f"table file {where}: expected \"format\": \"{FORMAT}\", got {found!r}")
    rules = doc.get("rules")
    if not isinstance(rules, dict) or not rules:
        raise TableFileError(f"table file {where}: \"rules\" must map ops to lists of rules")
    parsed = {key: _op_rules(key, op_rules, where) for key, op_rules in rules.items()}
    for key in parsed:  # a layout's rules stand beside the op's, which every other layout runs by
        if key_op(key) not in parsed:
            raise TableFileError(f"table file {where}: {key!r} needs {key_op(key)!r}'s own rules too (for the "
                                 f"other layouts): the file's rules replace all of the built-in ones for that op")
    return parsed


def _check_key(key: str, where: str) -> str:
    """The op of a rules key (an op, or "<op>@<layout>"), checked."""
    op, _, layout = key.partition(LAYOUT_SEPARATOR)
    if op not in OPS:
        raise TableFileError(f"table file {where}: unknown op {op!r}; ops are {list(OPS)}")
    if key == op:
        return op
    if not OPS[op].on_world:
        transitions = [name for name, spec in OPS.items() if spec.on_world]
        raise TableFileError(f"table file {where}: {key!r}: only the transitions ({', '.join(transitions)}) "
                             f"have rules for one layout")
    try:
        canonical = Layout.parse(layout).attention_name
    except ValueError:
        canonical = None
    if canonical != layout:
        raise TableFileError(f"table file {where}: {key!r}: expected a layout's attention name after "
                             f"{LAYOUT_SEPARATOR!r}, such as 'dp4', 'tp4' or 'dp2xtp2'")
    return op


def _op_rules(key: str, rules, where: str) -> tuple[Rule, ...]:
    _check_key(key, where)
    if not isinstance(rules, list) or not rules:
        raise TableFileError(f"table file {where}: {key}: expected a non-empty list of rules")
    parsed = tuple(_rule(key, i, r, where) for i, r in enumerate(rules))
    for i, (before, after) in enumerate(zip(parsed, parsed[1:])):
        if before.max_bytes is None or (after.max_bytes is not None and after.max_bytes <= before.max_bytes):
            raise TableFileError(f"table file {where}: {key}: max_bytes must increase from rule to rule; rule {i} "
                                 f"has {before.max_bytes}, rule {i + 1} {after.max_bytes}")
    if parsed[-1].max_bytes is not None:
        raise TableFileError(f"table file {where}: {key}: the last rule needs \"max_bytes\": null (every larger size)")
    return parsed


def _rule(key: str, i: int, r, where: str) -> Rule:
    what, op = f"table file {where}: {key} rule {i}", key_op(key)
    if not isinstance(r, dict) or set(r) != {"max_bytes", "backend", "algorithm"}:
        raise TableFileError(f"{what}: expected keys max_bytes, backend, algorithm; got {r!r}")
    limit, backend, algorithm = r["max_bytes"], r["backend"], r["algorithm"]
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise TableFileError(f"{what}: max_bytes must be a positive integer or null, got {limit!r}")
    if backend not in BACKENDS:
        raise TableFileError(f"{what}: unknown backend {backend!r}; a single-node table names {list(BACKENDS)}")
    names = [a.name for a in OPS[op].algorithms]
    if backend == "nvlink" and algorithm not in names:
        raise TableFileError(f"{what}: unknown algorithm {algorithm!r}; {op} has {names}")
    if backend == "nccl" and algorithm != "nccl":
        raise TableFileError(f"{what}: backend nccl runs algorithm \"nccl\", got {algorithm!r}")
    return Rule(limit, backend, algorithm)


def rules_text(rules: tuple[Rule, ...]) -> str:
    """Rules in one line: "<= 32 K: nvlink/one_shot; ...; larger: nccl/nccl"."""
    from .bench.report import human_bytes

    return "; ".join(f"{'<= ' + human_bytes(r.max_bytes) if r.max_bytes else 'larger'}: {r.backend}/{r.algorithm}"
                     for r in rules)


def describe_for_layout(table: dict[str, tuple[Rule, ...]], layout: str) -> str:
    """Which rules a communicator on `layout` (its attention name) runs each op by, one op a line:
    the transitions' rules for that layout where the table has them (algorithms.py)."""
    lines = []
    for op, spec in OPS.items():
        key = rules_key(table, op, layout if spec.on_world else None)
        whose = f"  ({layout}'s own)" if key != op else ("" if spec.on_world else "  (a group of any size)")
        lines.append(f"  {op:<19} {rules_text(table[key])}{whose}")
    return "\n".join(lines)


def write(doc: dict, path: str | Path) -> Path:
    """Write a table document after checking that it reads back."""
    parse(doc, str(path))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(doc) + "\n")
    return path


def dumps(value, indent: str = "") -> str:
    """JSON with one rule (or any value that fits in 110 characters) per line, for review."""
    flat = json.dumps(value)
    if len(indent) + len(flat) <= 110 or not isinstance(value, (dict, list)) or not value:
        return flat
    inner = indent + " "
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k)}: {dumps(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    return "[\n" + ",\n".join(inner + dumps(v, inner) for v in value) + f"\n{indent}]"
