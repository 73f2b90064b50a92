"""Results files: JSON (everything), a Markdown table and a PNG plot per benchmark."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

BASELINES = ("nccl", "nccl_symm", "symm_one_shot", "symm_two_shot")
# Transitions: the two-collective sequences, and for pure attention TP the one all-reduce.
TRANSITION_BASELINES = ("nccl", "nccl_symm", "nccl_ar", "nccl_symm_ar", "symm_one_shot_ar")


def input_elem_bytes(results: dict) -> int:
    """Bytes per element of a run's input dtype (its "dtype": "torch.bfloat16" or "bfloat16")."""
    import torch

    return getattr(torch, results["dtype"].removeprefix("torch.")).itemsize


def human_bytes(n: int) -> str:
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


BUSBW_RULE = {"all_reduce": "algbw x 2(n-1)/n", "all_gather_v": "algbw x (n-1)/n of the output",
              "reduce_scatter_v": "algbw x (n-1)/n of the input"}


def _header(env: dict) -> str:
    keys = ("date", "gpu", "gpus", "driver", "torch", "cuda", "nccl")
    return " | ".join(f"{k}: {env[k]}" for k in keys if k in env)


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.1f}" if v >= 100 else f"{v:.2f}"


def ops_markdown(results: dict) -> str:
    by, busbw = defaultdict(dict), defaultdict(dict)
    for r in results["records"]:
        by[(r["op"], r["bytes"])][r["impl"]] = r["us"]
        busbw[(r["op"], r["bytes"])][r["impl"]] = r.get("busbw_GBps")
    impls = sorted({r["impl"] for r in results["records"]}, key=lambda k: (k != "hybridcomm", k in BASELINES, k))
    # A ratio needs hybridcomm and a baseline in the same run (the CPU path has neither).
    ratios = "hybridcomm" in impls and any(b in impls for b in BASELINES)
    timing = results.get("timing", "CUDA graph replay, median of repeats, max over ranks")
    out = [f"# bench ops, world {results['world_size']}, {results['dtype']}", "", _header(results["environment"]), "",
           f"µs per call ({timing})" + ("; ratio = best baseline / hybridcomm (> 1: we are faster)." if ratios
                                       else "."), ""]
    for op in dict.fromkeys(r["op"] for r in results["records"]):
        rows = []
        for (o, nbytes), cols in sorted(by.items()):
            if o != op:
                continue
            base = [cols[b] for b in BASELINES if b in cols]
            ratio = [f"{min(base) / cols['hybridcomm']:.2f}x" if base and "hybridcomm" in cols else "-"]
            rows.append([human_bytes(nbytes)] + [_fmt(cols.get(i)) for i in impls] + (ratio if ratios else []))
        out += [f"## {op}", "", _table(["size"] + impls + (["ratio"] if ratios else []), rows), ""]
        bw_rows = [[human_bytes(nbytes)] + [_fmt(cols.get(i)) for i in impls]
                   for (o, nbytes), cols in sorted(busbw.items()) if o == op]
        out += [f"busbw, GB/s (nccl-tests: {BUSBW_RULE[op]})", "", _table(["size"] + impls, bw_rows), ""]
    if "eager_overhead_us" in results:
        out += ["## eager per-call cost (µs, wall clock, 2 KB all_reduce)", ""]
        out += [f"- {k}: {v:.1f}" for k, v in results["eager_overhead_us"].items()]
    out += _notes(results, ("workspace", "nccl_symm_note", "symm_mem_note", "shared_gpu"))
    return "\n".join(out) + "\n"


def _notes(results: dict, keys: tuple[str, ...]) -> list[str]:
    """The results' notes that are present, one paragraph each."""
    return [line for k in keys if results.get(k) for line in ("", f"{k}: {results[k]}")]


def transitions_markdown(results: dict) -> str:
    by = defaultdict(dict)
    for r in results["records"]:
        by[(r["layout"], r["op"], r["case"], tuple(r["tokens_per_dp"]))][r["impl"]] = r["us"]
    impls = sorted({r["impl"] for r in results["records"]})
    out = [f"# bench transitions, hidden {results['hidden']}, {results['dtype']}", "", _header(results["environment"]),
           "", "µs per call (CUDA graph replay, median, max over ranks); ratio = best baseline / hybridcomm "
           "(baselines: " + ", ".join(TRANSITION_BASELINES) + ", where present).", ""]
    for layout, op in dict.fromkeys((k[0], k[1]) for k in by):
        rows = []
        for (lay, o, case, tokens), cols in by.items():
            if (lay, o) != (layout, op):
                continue
            base = [cols[b] for b in TRANSITION_BASELINES if b in cols]
            ratio = f"{min(base) / cols['hybridcomm']:.2f}x" if base and "hybridcomm" in cols else "-"
            rows.append([case, ",".join(map(str, tokens))] + [_fmt(cols.get(i)) for i in impls] + [ratio])
        out += [f"## {layout} {op}", "", _table(["case", "tokens/DP rank"] + impls + ["ratio"], rows), ""]
    out += _notes(results, ("shared_gpu",))
    return "\n".join(out) + "\n"


def _log_plot(panels: dict[str, dict[str, list[tuple[float, float]]]], xlabel: str, env: dict,
              path: Path) -> str | None:
    """panels: title -> implementation -> (x, µs) points; log-log, hybridcomm drawn bold."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no plot"
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.5), squeeze=False)
    for ax, (title, series) in zip(axes[0], panels.items()):
        for impl, pts in sorted(series.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl,
                    linewidth=2.5 if impl == "hybridcomm" else 1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("µs per call")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(_header(env), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return None


def ops_plot(results: dict, path: Path) -> str | None:
    panels: dict = defaultdict(lambda: defaultdict(list))
    for r in results["records"]:
        panels[f"{r['op']}, world {results['world_size']}"][r["impl"]].append((r["bytes"], r["us"]))
    return _log_plot(panels, "message bytes", results["environment"], path)


def transitions_plot(results: dict, path: Path) -> str | None:
    panels: dict = defaultdict(lambda: defaultdict(list))
    for r in results["records"]:
        if r["case"] == "balanced":
            panels[f"{r['layout']} {r['op']}"][r["impl"]].append((r["tokens_per_dp"][0], r["us"]))
    return _log_plot(panels, "tokens per DP rank (balanced)", results["environment"], path)


def write(results: dict, out: Path, kind: str) -> tuple[list[Path], list[str]]:
    """out: the .json path; writes out, out.md and out.png beside it.
    Returns (the files written, why a plot was skipped)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    written = [out]
    from .quant import quant_markdown, quant_plot
    markdown = {"ops": ops_markdown, "transitions": transitions_markdown, "quant": quant_markdown}.get(kind)
    if markdown:
        out.with_suffix(".md").write_text(markdown(results))
        written.append(out.with_suffix(".md"))
    plot = {"ops": ops_plot, "transitions": transitions_plot, "quant": quant_plot}.get(kind)
    skipped = []
    if plot and not results.get("environment", {}).get("gpu"):
        skipped.append("CPU timings are a development path, not a speed claim worth a plot")
    elif plot:
        why = plot(results, out.with_suffix(".png"))
        if why is None:
            written.append(out.with_suffix(".png"))
        else:
            skipped.append(why)
    return written, skipped
