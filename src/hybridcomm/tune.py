"""`hybridcomm tune`: a selection table from benchmark results, as data (table_file.py).

Input: the JSON of `bench ops`, `bench transitions` and `bench quant` (GPU runs), whose records
time every algorithm forced (`hc_<algorithm>`) and the baselines at each size, in the same run.

Candidates are what a table rule can name: our algorithms (`hc_<algorithm>` of the op's
registry entry, backend nvlink; for the transitions also `hc_two_step`, our two row ops,
named `hc_unfused` in results taken before the table could name it) and NCCL (the `nccl`
column: NCCL called directly on the op; for the transitions the two-collective sequence the
NCCL backend runs). Baselines the Communicator cannot route to (NCCL on symmetric windows,
torch symm_mem) are not candidates. The transitions' forced fused gathers (`hc_fused`,
`hc_fused_lamport`) and `nccl_norm` fill gather_tokens_norm; in results without them, `hc_norm`
(then always the `fused` kernel) stands for `hc_fused`.
`bench quant` fills gather_tokens_quant: its message is the gathered quantized bytes (data and
scales), its NCCL candidate `nccl_q` (quantize, then NCCL all-gathers: the NCCL backend's path);
where attn_tp = 1 the bench times quant_one_hop and quant_local once, as quant (the kernel they
run there, backends/nvlink.py), and tune reads quant's column for them. There gather_tokens_quant
is also all_gather_v_quant over the world (the same rows, the same kernel: the op code only names
errors), so those layouts' records fill all_gather_v_quant too (quant, quant_lamport, nccl_q).
Only runs with host counts (`bench quant --counts host`, the default) are read: in the others our
columns got the counts on the device and NCCL's on the host.

Per op and measured size, the candidates that ran at that size are compared by their µs
(a transitions size measured on several layouts: the geometric mean over those layouts, and
only candidates that ran on all of them). Every candidate within TOLERANCE of the fastest is a
contender there (closer than that is measurement noise). Of all the ways to give each size
one of its contenders, tune takes the one with the fewest rules (changes of algorithm from
size to size); among those, the smallest sum over sizes of (µs / fastest µs - 1); then the
simpler: the op's algorithms in registry order (ops.OPS lists the simpler first), then NCCL.
So a near-tie never adds a rule, and a boundary sits where the difference is real.
Adjacent sizes with the same winner merge into one rule whose max_bytes is the largest
measured size it won: a size between two measured sizes goes to the larger size's winner (no
kernel is extended past a size where it was measured to win). Past the largest measured size
NCCL runs (a last rule `max_bytes: null` on nccl is added when NCCL did not win there).

Where attn_tp = 1 a transition runs the op it reduces to (ops.reduced: gather_tokens' two_shot
runs all_gather_v's one-shot kernel, as its one_shot does; two_step runs the kernel that op's rule
names at that size, tuned first), so a candidate that runs another's kernel there reads that one's
time: two timings of one kernel differ by noise alone, and must not decide a rule.

The transitions get rules for one layout (algorithms.py: "scatter_tokens@tp4") where the op's
rules, chosen over every layout, lose on that one: where at some size of it they run a candidate
more than TOLERANCE slower than its fastest there. Those rules are tuned from that layout's
measurements alone, the same way, up to its largest measured size; past it the op's rules go on
(they were measured there on other layouts; the layout was not).

Only the balanced transitions (and quant) cases count (a rule is keyed by message bytes and
layout, and an imbalanced case's bytes do not say how they are spread over the ranks). Results
across simulated nodes (`bench nodes`) are refused: this writes the single-node table.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from .algorithms import TABLE, Rule, layout_key, rule_at
from .bench.report import input_elem_bytes
from .layout import Layout
from .ops import OPS, reduced
from .table_file import FORMAT, rules_to_json

# Identical kernels timed twice in one run differ by up to 3.5% (results/4xH200/transitions:
# on dp4, gather_tokens' hc_two_shot runs the same all_gather_v kernel as hc_one_shot; median
# difference 0.9%). A difference below 5% is not taken as a real one.
TOLERANCE = 0.05

NCCL = ("nccl", "nccl")
# Benchmark columns that fill another op's rules: (measured op, column) -> (table op, backend, algorithm).
OTHER_OP_COLUMNS = {
    ("gather_tokens", "hc_fused"): ("gather_tokens_norm", "nvlink", "fused"),
    ("gather_tokens", "hc_fused_lamport"): ("gather_tokens_norm", "nvlink", "fused_lamport"),
    ("gather_tokens", "hc_norm"): ("gather_tokens_norm", "nvlink", "fused"),
    ("gather_tokens", "nccl_norm"): ("gather_tokens_norm", *NCCL),
}
# Columns that stand for another only in results without it: hc_norm is the Communicator's choice
# of fused gather, which was `fused` whenever no forced fused columns were timed (before
# fused_lamport existed); where hc_fused is there, hc_norm is no candidate.
STAND_INS = {"hc_norm": "hc_fused"}
# Columns that older results name otherwise: hc_unfused timed the two_step composition
# (two_step.py: the same two sub-ops, each by the table) before it was an algorithm.
RENAMED_COLUMNS = {"hc_unfused": "hc_two_step"}
# bench quant: the op its records time, its NCCL column, and the algorithms that run another's
# kernel where attn_tp = 1 (not timed there; module docstring).
QUANT_OP, QUANT_NCCL_COLUMN = "gather_tokens_quant", "nccl_q"
QUANT_SAME_AS_OWNER = {"hc_quant_one_hop": "hc_quant", "hc_quant_local": "hc_quant"}
# The op that attn_tp = 1 layouts' quant records also time (module docstring).
QUANT_OP_ON_WORLD = "all_gather_v_quant"


# What each benchmark's results hold: a top-level key, and the fields of every record.
RESULTS_KINDS = {"ops": ("world_size", {"op", "bytes", "impl", "us"}),
                 "transitions": ("hidden", {"layout", "op", "case", "tokens_per_dp", "impl", "us"}),
                 "quant": ("dtype", {"layout", "format", "hidden", "case", "tokens_per_dp", "impl", "us"})}


class ResultsError(ValueError):
    """A results file tune cannot use; the message names the file."""


def candidate(op: str, impl: str) -> tuple[str, str, str] | None:
    """(table op, backend, algorithm) a benchmark column stands for, or None (a baseline)."""
    if (op, impl) in OTHER_OP_COLUMNS:
        return OTHER_OP_COLUMNS[(op, impl)]
    if op not in OPS:
        return None
    impl = RENAMED_COLUMNS.get(impl, impl)
    if impl == "nccl":
        return (op, *NCCL)
    names = [a.name for a in OPS[op].algorithms]
    if impl.startswith("hc_") and impl[3:] in names:
        return op, "nvlink", impl[3:]
    return None


def preference(op: str) -> list[tuple[str, str]]:
    """Candidates of `op`, the preferred (simpler) first: registry order, then NCCL."""
    return [("nvlink", a.name) for a in OPS[op].algorithms] + [NCCL]


def _world(results: dict, where: str) -> int:
    if "world_size" in results:
        return int(results["world_size"])
    worlds = {Layout.parse(r["layout"]).world_size for r in results["records"]}
    if len(worlds) != 1:
        raise ResultsError(f"{where}: records of several world sizes {sorted(worlds)}")
    return worlds.pop()


def kind(results, where: str) -> str:
    """"ops" or "transitions": which benchmark wrote these results (ResultsError otherwise)."""
    if isinstance(results, dict) and "ranks_per_node" in results:
        raise ResultsError(f"{where}: measured across simulated nodes (`bench nodes`); tune writes the "
                           f"single-node table from `bench ops` / `bench transitions` results")
    for name, (top, fields) in RESULTS_KINDS.items():
        if (isinstance(results, dict) and {top, "environment"} <= set(results)
                and isinstance(results.get("records"), list)
                and all(isinstance(r, dict) and fields <= set(r) for r in results["records"])):
            modes = {r.get("counts", "host") for r in results["records"]}
            if modes != {"host"} and results["records"]:
                raise ResultsError(f"{where}: timed with `bench quant --counts {'/'.join(sorted(modes - {'host'}))}`; "
                                   f"tune reads runs with host counts, as the NCCL column took them")
            return name
    raise ResultsError(f"{where}: not the results of `hybridcomm bench ops`, `bench transitions` or `bench "
                       f"quant` (other benchmarks do not time the algorithms a table rule names)")


def quant_records(results: dict) -> list[dict]:
    """bench quant's balanced records as the other benchmarks' (op, bytes, impl, us), with the
    columns QUANT_SAME_AS_OWNER fills where attn_tp = 1, and there for QUANT_OP_ON_WORLD too."""
    from .quant import FORMATS

    points: dict = defaultdict(dict)
    for r in results["records"]:
        if r["case"] == "balanced":
            nbytes = sum(r["tokens_per_dp"]) * FORMATS[r["format"]].row_bytes(r["hidden"])
            points[(r["layout"], nbytes)][r["impl"]] = r["us"]
    records = []
    for (layout, nbytes), us in points.items():
        ops = [QUANT_OP]
        if Layout.parse(layout).attn_tp == 1:
            us = {**{a: us[o] for a, o in QUANT_SAME_AS_OWNER.items() if o in us}, **us}
            ops.append(QUANT_OP_ON_WORLD)
        for op in ops:
            records += [{"op": op, "layout": layout, "bytes": nbytes,
                         "impl": "nccl" if impl == QUANT_NCCL_COLUMN else impl, "us": t} for impl, t in us.items()]
    return records


def samples(results: dict, where: str) -> dict[str, dict[int, dict[str, dict[tuple[str, str], float]]]]:
    """table op -> message bytes -> group ((`where`, the layout for transitions and quant, else
    None)) -> candidate -> µs."""
    what = kind(results, where)
    if what == "quant":
        return _samples(quant_records(results), where, lambda r: (r["bytes"], (where, r["layout"])))
    if what == "ops":
        return _samples(results["records"], where, lambda r: (r["bytes"], (where, None)))
    elem = input_elem_bytes(results)  # transitions: message = all tokens x hidden
    timed = {r["impl"] for r in results["records"]}
    records = [r for r in results["records"] if r["case"] == "balanced" and STAND_INS.get(r["impl"]) not in timed]
    return _samples(records, where,
                    lambda r: (sum(r["tokens_per_dp"]) * results["hidden"] * elem, (where, r["layout"])))


def _samples(records: list[dict], where: str, place) -> dict:
    """samples() of records with op, impl, us; place(record) -> (message bytes, group)."""
    out: dict = defaultdict(lambda: defaultdict(dict))
    for r in records:
        found = candidate(r["op"], r["impl"])
        if found is None or not math.isfinite(r["us"]):
            continue
        op, backend, algorithm = found
        nbytes, group = place(r)
        out[op][nbytes].setdefault(group, {})[(backend, algorithm)] = r["us"]
    return out


def compare(groups: dict[str, dict[tuple[str, str], float]]) -> dict[tuple[str, str], float]:
    """Candidate -> µs at one size: the geometric mean over the groups, of the candidates that
    ran in every group."""
    common = set.intersection(*(set(g) for g in groups.values()))
    return {c: math.exp(sum(math.log(g[c]) for g in groups.values()) / len(groups)) for c in common}


def winners(sizes: list[dict[tuple[str, str], float]], order: list[tuple[str, str]],
            tolerance: float) -> list[tuple[str, str]]:
    """One candidate per size (candidate -> µs, in increasing size): a contender at each size,
    the fewest changes, then the least slowdown, then the simpler (module docstring).
    Dynamic programming over (size, candidate) with the cost as a tuple compared in order."""
    best: list[dict] = []  # per size: candidate -> ((rules, slowdown, rank), candidate at the size before)
    for us in sizes:
        fastest = min(us.values())
        here = {}
        for c, t in us.items():
            if t > fastest * (1 + tolerance):
                continue  # not a contender
            slowdown, rank = round((t / fastest - 1) * 1e6), order.index(c)  # in ppm: integer sums tie exactly
            if not best:
                here[c] = ((1, slowdown, rank), None)
                continue
            here[c] = min(((rules + (prev != c), slow + slowdown, ranks + rank), prev)
                          for prev, ((rules, slow, ranks), _) in best[-1].items())
        best.append(here)
    chosen = [min(best[-1], key=lambda c: best[-1][c][0])]
    for i in range(len(sizes) - 1, 0, -1):
        chosen.append(best[i][chosen[-1]][1])
    return chosen[::-1]


def rules_from_winners(winners: list[tuple[int, tuple[str, str]]]) -> tuple[Rule, ...]:
    """(size, winner) in increasing size -> rules: one per run of the same winner, up to the
    largest size it won; NCCL past the largest measured size."""
    rules: list[Rule] = []
    for i, (nbytes, (backend, algorithm)) in enumerate(winners):
        last_of_run = i + 1 == len(winners) or winners[i + 1][1] != (backend, algorithm)
        if last_of_run:
            rules.append(Rule(nbytes, backend, algorithm))
    if (rules[-1].backend, rules[-1].algorithm) == NCCL:
        rules[-1] = Rule(None, *NCCL)
    else:
        rules.append(Rule(None, *NCCL))
    return tuple(rules)


def tune_op(op: str, by_size: dict[int, dict], tolerance: float = TOLERANCE):
    """An op's rules and the evidence (per measured size, each candidate's µs and the winner);
    None where no size has a candidate that ran on every layout measured there."""
    measured = [(nbytes, us) for nbytes in sorted(by_size) if (us := compare(by_size[nbytes]))]
    if not measured:
        return None
    chosen = winners([us for _, us in measured], preference(op), tolerance)
    evidence = [{"bytes": nbytes, "chosen": "/".join(c), "measured_in": sorted(map(_label, by_size[nbytes])),
                 "us": {"/".join(k): round(t, 3) for k, t in sorted(us.items(), key=lambda kv: kv[1])}}
                for (nbytes, us), c in zip(measured, chosen)]
    return rules_from_winners([(nbytes, c) for (nbytes, _), c in zip(measured, chosen)]), evidence


def _label(group: tuple[str, str | None]) -> str:
    """A group as the evidence names it: the file, and the layout where there is one."""
    where, layout = group
    return where if layout is None else f"{where}:{layout}"


def same_kernel_times(op: str, by_size: dict[int, dict], rules: dict[str, tuple[Rule, ...]]) -> None:
    """Where attn_tp = 1: each candidate of a transition that runs another candidate's kernel
    reads that one's time (module docstring); `rules`: those tuned so far (the reduced op's),
    else the built-in table's."""
    if "attn_tp" not in OPS[op].reduces_to:
        return
    for nbytes, groups in by_size.items():
        for (_, layout), us in groups.items():
            if layout is None or Layout.parse(layout).attn_tp != 1:
                continue
            for (backend, algorithm) in list(us):
                runs = _kernel_where_attn_tp_is_1(op, algorithm, nbytes, rules, TABLE) if backend == "nvlink" else None
                if runs is not None and runs != algorithm and ("nvlink", runs) in us:
                    us[(backend, algorithm)] = us[("nvlink", runs)]


def _kernel_where_attn_tp_is_1(op: str, algorithm: str, nbytes: int, rules: dict, table: dict) -> str | None:
    """The algorithm of `op` that runs the same kernel as `algorithm` where attn_tp = 1 (the
    one named like the reduced op's algorithm), or None (NCCL, or no such algorithm)."""
    if OPS[op].algorithm(algorithm).composed:
        other = OPS[op].reduces_to["attn_tp"]
        rule = rule_at(rules.get(other) or table[other], nbytes)
        runs = rule.algorithm if rule.backend == "nvlink" else None
    else:
        runs = reduced(op, algorithm)[1]
    return runs if runs in [a.name for a in OPS[op].algorithms] else None


def per_layout(by_size: dict[int, dict]) -> dict[str, dict[int, dict]]:
    """A transition's samples (bytes -> group -> candidate -> µs) split by layout."""
    out: dict = defaultdict(lambda: defaultdict(dict))
    for nbytes, groups in by_size.items():
        for group, us in groups.items():
            out[group[1]][nbytes][group] = us
    return out


def loses(rules: tuple[Rule, ...], by_size: dict[int, dict], tolerance: float) -> bool:
    """Whether `rules` run, at some measured size, a candidate more than `tolerance` slower than
    the fastest there (candidates compared as tune_op does; a size where the rules' candidate did
    not run says nothing)."""
    for nbytes, groups in by_size.items():
        us = compare(groups)
        rule = rule_at(rules, nbytes)
        if us and us.get((rule.backend, rule.algorithm), 0) > min(us.values()) * (1 + tolerance):
            return True
    return False


def continued(own: tuple[Rule, ...], general: tuple[Rule, ...], largest: int) -> tuple[Rule, ...]:
    """A layout's own rules to `largest`, its largest measured size, and the op's `general`
    rules past it (where its own rules end with NCCL only because nothing larger was measured:
    rules_from_winners; NCCL that won at `largest` stays)."""
    if len(own) < 2 or own[-2].max_bytes != largest:
        return own
    head, tail = list(own[:-1]), [r for r in general if r.max_bytes is None or r.max_bytes > largest]
    if (tail[0].backend, tail[0].algorithm) == (head[-1].backend, head[-1].algorithm):
        head[-1] = tail.pop(0)
    return tuple(head + tail)


def measured_on(sources: list[tuple[str, dict]]) -> dict:
    """GPU, world size, each source's date and environment; every source must agree on the
    first two (a table is for one machine shape)."""
    shapes = {(r["environment"].get("gpu", "no GPU"), _world(r, where)) for where, r in sources}
    if len(shapes) != 1:
        listed = ", ".join(f"{where}: {r['environment'].get('gpu', 'no GPU')} x{_world(r, where)}"
                           for where, r in sources)
        raise ResultsError(f"results of different machines ({listed}); tune one GPU model and world size at a time")
    gpu, world = shapes.pop()
    return {"gpu": gpu, "world_size": world,
            "sources": [{"file": where, "environment": r["environment"]} for where, r in sources]}


def tune(sources: list[tuple[str, dict]], tolerance: float = TOLERANCE) -> dict:
    """(name, results) pairs -> the table document table_file.py reads."""
    merged: dict = defaultdict(lambda: defaultdict(dict))
    for where, results in sources:
        for op, by_size in samples(results, where).items():
            for nbytes, groups in by_size.items():
                merged[op][nbytes].update(groups)
    if not merged:
        raise ResultsError(f"{', '.join(w for w, _ in sources)}: no column the table can name (hc_<algorithm> or "
                           f"nccl; a CPU run has the reference backend only)")
    shape = measured_on(sources)
    rules, evidence = {}, {}
    for op in OPS:  # registry order
        if op in merged:
            same_kernel_times(op, merged[op], rules)
        tuned = tune_op(op, merged[op], tolerance) if op in merged else None
        if tuned is None:
            continue
        rules[op], evidence[op] = tuned
        if not OPS[op].on_world:
            continue
        for layout, by_size in sorted(per_layout(merged[op]).items()):  # rules for one layout (docstring)
            if loses(rules[op], by_size, tolerance):
                key = layout_key(op, layout)
                own, evidence[key] = tune_op(op, by_size, tolerance)
                rules[key] = continued(own, rules[op], max(by_size))
    return {"format": FORMAT, "measured_on": shape,
            "method": {"tolerance": tolerance, "tool": "hybridcomm tune (src/hybridcomm/tune.py: how the "
                                                        "winner and the boundaries are chosen)"},
            "not_measured": [op for op in OPS if op not in rules],
            "rules": rules_to_json(rules), "evidence": evidence}


def tune_files(paths: list[str], tolerance: float = TOLERANCE) -> dict:
    import json

    sources = []
    for p in paths:
        try:
            sources.append((str(p), json.loads(Path(p).read_text())))
        except OSError as e:
            raise ResultsError(f"--from {p}: cannot read it ({e.strerror})") from None
        except json.JSONDecodeError as e:
            raise ResultsError(f"--from {p}: not JSON ({e})") from None
    return tune(sources, tolerance)


# What `tune` measures of the quantized gathers (bench quant): every format at the model hidden
# sizes, the token counts gpu_check.sh's quant stage times.
QUANT_TOKENS = [1, 16, 64, 128, 256, 512, 1024]


def measure(world: int, layouts: list[Layout], sizes: list[int] | None, out: str | None) -> list[tuple[str, dict]]:
    """Run `bench ops`, `bench transitions` and `bench quant` on `world` GPUs; with `out`, save
    their results beside it (<stem>_ops.json, <stem>_transitions.json, <stem>_quant.json, with
    .md and .png) so the table's sources exist as files."""
    from .bench import report
    from .bench.ops import bench_ops
    from .bench.quant import HIDDENS, bench_quant
    from .bench.transitions import bench_transitions
    from .quant import FORMATS

    names = [lay.name for lay in layouts]
    runs = [("ops", bench_ops(world, "cuda", sizes)),
            ("transitions", bench_transitions(names, world)),
            ("quant", bench_quant(names, list(FORMATS), list(HIDDENS), QUANT_TOKENS, world))]
    sources = []
    for kind, results in runs:
        name = f"bench {kind} (not saved)"
        if out:
            path = Path(out)
            name = str(path.with_name(f"{path.stem}_{kind}.json"))
            report.write(results, name, kind)
        sources.append((name, results))
    return sources


def describe(doc: dict) -> str:
    """The table in words, each op beside the built-in table's rules where they differ."""
    from .table_file import parse, rules_text

    shape = doc["measured_on"]
    dates = ", ".join(f"{s['file']} ({s['environment'].get('date', 'undated')})" for s in shape["sources"])
    lines = [f"table for {shape['gpu']} x{shape['world_size']}, tolerance {doc['method']['tolerance']:.0%}, "
             f"from {dates}"]
    for key, rules in parse(doc, "tune").items():
        built_in = TABLE.get(key)
        lines.append(f"  {key:<27} {rules_text(rules)}" + ("  (= built-in)" if rules == built_in else ""))
        if rules != built_in:
            lines.append(f"  {'':<27} built-in: {rules_text(built_in) if built_in else 'none for this layout'}")
    if doc["not_measured"]:
        lines.append(f"  not measured (the built-in rules apply): {', '.join(doc['not_measured'])}")
    return "\n".join(lines)
