"""Two runs of one benchmark side by side: what a kernel change did, record by record.

A record of `bench ops`, `transitions` or `quant` is one time (`us`) of one implementation in one
case; every other field names the case (op, layout, format, hidden, tokens, impl, ...). Records
of the two runs with the same naming fields are paired, and each pair gives after / before (< 1:
the change is faster). Fields derived from the time (busbw) are not names. Records in only one
run are counted, not paired.

Two runs of one machine drift (by how much: experiments/README.md); `scripts/time_experiments.sh`
therefore times main before and after the change, and a change counts only where it beats both.
`bracketed_markdown` reads such a triple case by case: the change against each main run, and
whether it differs from both by more than they differ from each other (a verdict; else within
the drift).
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


def bracketed(main_1: dict, change: dict, main_2: dict) -> list[tuple[dict, float, float, float]]:
    """[(naming fields, main_1 us, change us, main_2 us)] over the records all three runs have."""
    first, _ = paired(main_1, change)
    second = {record_key(case): a for case, _, a in paired(main_1, main_2)[0]}
    return [(case, m1, c, second[record_key(case)]) for case, m1, c in first if record_key(case) in second]


def verdict(m1: float, c: float, m2: float) -> str:
    """The change's time c between main's m1 and m2: "faster" / "slower" where it lies beyond both
    by more than they differ from each other, "" (within the drift) otherwise."""
    drift = abs(m2 - m1)
    if min(m1, m2) - c > drift:
        return "faster"
    if c - max(m1, m2) > drift:
        return "slower"
    return ""


def bracketed_markdown(main_1: dict, change: dict, main_2: dict, impls: set[str] | None = None) -> str:
    """A table of every case the three runs share (limited to `impls`): the three times, the
    change over each main run, the drift (main_2 / main_1) and the verdict; and per impl how
    many cases are faster, slower or within the drift."""
    rows3 = [r for r in bracketed(main_1, change, main_2) if impls is None or r[0].get("impl") in impls]
    if not rows3:
        return "(no records in common)\n"
    fields = [k for k in rows3[0][0] if k != "impl"] + ["impl"]
    rows, tally = [], {}
    for case, m1, c, m2 in rows3:
        v = verdict(m1, c, m2)
        counts = tally.setdefault(str(case.get("impl")), {"faster": 0, "slower": 0, "": 0})
        counts[v] += 1
        rows.append([_cell(case.get(k)) for k in fields]
                    + [_fmt(m1), _fmt(c), _fmt(m2), f"{c / m1:.3f}", f"{c / m2:.3f}", f"{m2 / m1:.3f}", v])
    summary = [[impl, str(n["faster"]), str(n["slower"]), str(n[""])] for impl, n in sorted(tally.items())]
    return ("µs per call; change / main_1 and change / main_2 (< 1: the change is faster); main_2 / main_1: "
            "the drift. Verdict: the change beyond both main runs by more than the drift.\n\n"
            + _table(["impl", "faster", "slower", "within the drift"], summary) + "\n\n"
            + _table(fields + ["main_1", "change", "main_2", "c/m1", "c/m2", "m2/m1", "verdict"], rows) + "\n")
