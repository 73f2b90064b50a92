"""Two runs of one benchmark side by side: what a kernel change did, record by record.

A record of `bench ops`, `transitions` or `quant` is one time (`us`) of one implementation in one
case; every other field names the case (op, layout, format, hidden, tokens, impl, ...). Records
of the two runs with the same naming fields are paired, and each pair gives after / before (< 1:
the change is faster). Fields derived from the time (busbw) are not names. Records in only one
run are counted, not paired.

Two runs of one machine drift (by how much: experiments/README.md); `scripts/time_experiments.sh`
therefore times main before and after the change, and a change counts only where it beats both.
"""

from __future__ import annotations

from statistics import median

from .report import _fmt, _table

TIME = "us"
DERIVED = {"busbw_GBps"}  # computed from the time: not part of a record's name


def _cell(v) -> str:
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v)
    return _fmt(v) if isinstance(v, float) else str(v)


def record_key(record: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in record.items() if k != TIME and k not in DERIVED))


def paired(before: dict, after: dict) -> tuple[list[tuple[dict, float, float]], int]:
    """[(naming fields, before us, after us)] over the records both runs have; and how many
    records only one of them has."""
    def index(results: dict) -> dict[tuple, dict]:
        return {record_key(r): r for r in results["records"] if r.get(TIME) is not None}

    b, a = index(before), index(after)
    pairs = [({k: v for k, v in b[key].items() if k != TIME and k not in DERIVED}, b[key][TIME], a[key][TIME])
             for key in b if key in a]
    return pairs, len(b.keys() ^ a.keys())


def compare_markdown(before: dict, after: dict, impls: set[str] | None = None,
                     names: tuple[str, str] = ("before", "after")) -> str:
    """A table of every pair (limited to `impls` if given), and the median ratio per impl."""
    pairs, unpaired = paired(before, after)
    pairs = [p for p in pairs if impls is None or p[0].get("impl") in impls]
    if not pairs:
        return "(no records in common)\n"
    fields = [k for k in pairs[0][0] if k != "impl"] + ["impl"]
    rows = [[_cell(case.get(k)) for k in fields] + [_fmt(b), _fmt(a), f"{a / b:.3f}"] for case, b, a in pairs]
    per_impl: dict[str, list[float]] = {}
    for case, b, a in pairs:
        per_impl.setdefault(str(case.get("impl")), []).append(a / b)
    summary = [[impl, str(len(r)), f"{median(r):.3f}", f"{min(r):.3f}", f"{max(r):.3f}"]
               for impl, r in sorted(per_impl.items())]
    before_name, after_name = names
    return (f"µs per call; ratio = {after_name} / {before_name} (< 1: {after_name} is faster). "
            f"{unpaired} record(s) in only one run.\n\n"
            + _table(["impl", "pairs", "median ratio", "min", "max"], summary) + "\n\n"
            + _table(fields + [before_name, after_name, "ratio"], rows) + "\n")
