"""Where a small call's time goes, per rank and per phase, from the trace build's in-kernel
timestamps (csrc/trace.cuh, hybridcomm/trace.py). scripts/latency_trace.py runs it.

Each case is captured `CALLS` times back to back in one CUDA graph (as the benchmarks time
it) and replayed `REPLAYS` times; every call's record is read back. Phases are the
differences between consecutive stamps of block 0's thread 0, in its SM's cycles converted to
ns (%globaltimer ticks coarsely on some GPUs; the conversion rate is measured from both
clocks over the whole run), medians over calls; the kernel's end (the last block), the gap to
the previous kernel and cross-rank quantities come from %globaltimer, so their means are
printed too (a coarse tick biases a median, not a mean).

Cross-rank: the GPUs' global timers may be offset. The offset of rank r against rank 0 is
estimated NTP-style from the data itself: min over calls of (r's data arrived - 0's data
sent) = latency + offset, and the same the other way = latency - offset.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from .. import build, trace
from ..algorithms import NAMED_TABLES
from ..communicator import Communicator
from ..layout import Layout
from . import timing
from .quant import GLOBAL_SCALE

CALLS, REPLAYS = 50, 20  # records per case: CALLS * REPLAYS <= trace.RECORDS
HIDDEN = 4096


@dataclass(frozen=True)
class TraceCase:
    name: str
    op: str  # "all_reduce" (size: bytes) | "gather_tokens" (size: tokens per DP rank, DP over the world)
    table: str  # algorithms.NAMED_TABLES key
    size: int
    quant: str | None = None  # gather_tokens: a quantized gather of this format (hybridcomm.quant)
    attn_tp: int = 1  # gather_tokens: attention TP (partial rows), DP over the rest of the world
    hidden: int = HIDDEN  # gather_tokens: row width (bf16 elements)


CASES = (
    TraceCase("all_reduce 2 KB, LL one-shot", "all_reduce", "one_shot", 2048),
    TraceCase("all_reduce 2 KB, Lamport one-shot", "all_reduce", "lamport", 2048),
    TraceCase("all_reduce 32 KB, LL one-shot", "all_reduce", "one_shot", 32768),
    TraceCase("gather_tokens DP, 1 token", "gather_tokens", "auto", 1),
    TraceCase("gather_tokens DP, 16 tokens", "gather_tokens", "auto", 16),
    TraceCase("gather_tokens DP, 1 token, Lamport", "gather_tokens", "lamport", 1),
    TraceCase("gather_tokens DP, 128 tokens", "gather_tokens", "auto", 128),
    # The quantized gathers (csrc/quant_gather.cu on LL, lamport_quant_gather.cu), each forced.
    TraceCase("gather_tokens DP, 1 token, quant fp8 LL", "gather_tokens", "quant_ll", 1, "fp8"),
    TraceCase("gather_tokens DP, 1 token, quant fp8 Lamport", "gather_tokens", "lamport", 1, "fp8"),
    TraceCase("gather_tokens DP, 128 tokens, quant fp8 LL", "gather_tokens", "quant_ll", 128, "fp8"),
    TraceCase("gather_tokens DP, 128 tokens, quant fp8 Lamport", "gather_tokens", "lamport", 128, "fp8"),
    TraceCase("gather_tokens DP, 512 tokens, quant fp8 Lamport", "gather_tokens", "lamport", 512, "fp8"),
    TraceCase("gather_tokens DP, 512 tokens, Lamport", "gather_tokens", "lamport", 512),
    TraceCase("gather_tokens DP, 16 tokens, quant nvfp4 LL", "gather_tokens", "quant_ll", 16, "nvfp4"),
    TraceCase("gather_tokens DP, 16 tokens, quant nvfp4 Lamport", "gather_tokens", "lamport", 16, "nvfp4"),
    TraceCase("gather_tokens TP2, 1 token", "gather_tokens", "auto", 1, attn_tp=2),
    TraceCase("gather_tokens TP2, 1 token, quant fp8 LL", "gather_tokens", "quant_ll", 1, "fp8", attn_tp=2),
    TraceCase("gather_tokens TP2, 1 token, quant fp8 Lamport", "gather_tokens", "lamport", 1, "fp8", attn_tp=2),
    TraceCase("gather_tokens TP2, 1 token, quant fp8 one hop", "gather_tokens", "quant_one_hop", 1, "fp8", attn_tp=2),
    TraceCase("gather_tokens TP2, 128 tokens", "gather_tokens", "auto", 128, attn_tp=2),
    TraceCase("gather_tokens TP2, 128 tokens, quant fp8 LL", "gather_tokens", "quant_ll", 128, "fp8", attn_tp=2),
    TraceCase("gather_tokens TP2, 128 tokens, quant fp8 one hop", "gather_tokens", "quant_one_hop", 128, "fp8",
              attn_tp=2),
    TraceCase("gather_tokens TP2, 1 token, quant fp8 local", "gather_tokens", "quant_local", 1, "fp8", attn_tp=2),
    TraceCase("gather_tokens TP2, 1 token, quant nvfp4 local", "gather_tokens", "quant_local", 1, "nvfp4",
              attn_tp=2),
    TraceCase("gather_tokens TP2, 128 tokens, quant fp8 local", "gather_tokens", "quant_local", 128, "fp8",
              attn_tp=2),
    TraceCase("gather_tokens TP2, 1 token, hidden 7168", "gather_tokens", "auto", 1, attn_tp=2, hidden=7168),
    TraceCase("gather_tokens TP2, 1 token, hidden 7168, quant fp8 local", "gather_tokens", "quant_local", 1, "fp8",
              attn_tp=2, hidden=7168),
)

# (phase, from event, to event): block 0 thread 0's stamps, in cycles. A phase whose end event
# a kernel does not stamp is measured to the next stamped event instead (see phase_spans).
PHASES = (
    ("pdl wait (entry -> ready)", "entry", "ready"),
    ("prologue (flag, fingerprint, arrive)", "ready", "arrived"),
    ("store (own data to peers)", "arrived", "sent"),
    ("refill (Lamport)", "sent", "refilled"),
    ("until first poll", "refilled", "wait_begin"),
    ("wait for peers' data", "wait_begin", "wait_end"),
    ("unpack / sum / write out", "wait_end", "end_begin"),
    ("arrival packets (end_call)", "end_begin", "arrivals"),
    ("last-block count", "arrivals", "counted"),
    ("epilogue to exit", "counted", "exit"),
)


def _call(case: TraceCase, comm: Communicator, device):
    if case.op == "all_reduce":
        x = torch.randn(case.size // 2, dtype=torch.bfloat16, device=device)
        return lambda: comm.all_reduce(x)
    x = torch.randn(case.size, case.hidden, dtype=torch.bfloat16, device=device)
    tokens = [case.size] * comm.layout.attn_dp
    if case.quant:
        scale = GLOBAL_SCALE if case.quant == "nvfp4" else None
        return lambda: comm.gather_tokens(x, tokens, quant=case.quant, global_scale=scale)
    return lambda: comm.gather_tokens(x, tokens)


def record_case(case: TraceCase) -> dict:
    """Worker (every rank): this rank's records of CALLS x REPLAYS graph-replayed calls, and
    the replay-timed µs per call (of the trace build)."""
    build.variant = "trace"
    world = dist.get_world_size()
    comm = Communicator(Layout(world, attn_tp=case.attn_tp), table=NAMED_TABLES[case.table])
    device = comm.device
    call = _call(case, comm, device)
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            call()
    graph.replay()
    torch.cuda.synchronize()
    comm.check_errors()
    dist.barrier()
    trace.clear()
    us = timing.replay_us(graph, REPLAYS) / CALLS
    records = trace.read()
    comm.check_errors()
    del graph
    comm.close()
    return {"records": records, "us_per_call": us, "backend": comm.last_choice.backend,
            "algorithm": comm.last_choice.algorithm}


# -- analysis (plain numpy: runs anywhere) ----------------------------------------------------------
def _ev(name: str) -> int:
    return trace.EVENTS.index(name)


def phase_spans(rec: np.ndarray, rate_ghz: float) -> dict[str, np.ndarray]:
    """Phase -> ns per call (NaN where the kernel stamps neither end): a missing start event
    falls back to the latest stamped event before it, so the phases add up."""
    cycles = rec["cycles"].astype(np.float64)
    out = {}
    for name, start, stop in PHASES:
        s, e = _ev(start), _ev(stop)
        # latest stamped event at or before `start`
        begin = np.full(len(rec), np.nan)
        for k in range(s, -1, -1):
            begin = np.where(np.isnan(begin) & (cycles[:, k] > 0), cycles[:, k], begin)
        end = np.where(cycles[:, e] > 0, cycles[:, e], np.nan)
        out[name] = (end - begin) / rate_ghz
    return out


def clock_rate_ghz(rec: np.ndarray) -> float:
    """SM cycles per ns, from both clocks over every call (ready -> exit of block 0's thread 0)."""
    r, x = _ev("ready"), _ev("exit")
    dc = (rec["cycles"][:, x].astype(np.float64) - rec["cycles"][:, r]).sum()
    dn = (rec["ns"][:, x].astype(np.float64) - rec["ns"][:, r]).sum()
    return float(dc / dn) if dn > 0 else float("nan")


def timer_tick_ns(rec: np.ndarray) -> float:
    """The smallest positive step seen between stamps of one call: the global timer's tick."""
    ns = rec["ns"].astype(np.int64)
    d = np.diff(np.sort(ns, axis=1), axis=1)
    d = d[d > 0]
    return float(d.min()) if d.size else float("nan")


def _med(a) -> float:
    a = np.asarray(a, dtype=np.float64)
    a = a[~np.isnan(a)]
    return float(np.median(a)) if a.size else float("nan")


def _mean(a) -> float:
    a = np.asarray(a, dtype=np.float64)
    a = a[~np.isnan(a)]
    return float(a.mean()) if a.size else float("nan")


def global_phases(rec: np.ndarray) -> dict[str, np.ndarray]:
    """Phases from the global timer: between calls (back to back in one graph) and to the end."""
    ns = rec["ns"].astype(np.float64)
    last = rec["last_ns"].astype(np.float64)
    ready, entry = ns[:, _ev("ready")], ns[:, _ev("entry")]
    prev_last = np.concatenate([[np.nan], last[:-1]])
    first = (np.arange(len(rec)) % CALLS) == 0  # a replay's first call follows the host, not a kernel
    prev_last[first] = np.nan
    period = np.concatenate([np.diff(ready), [np.nan]])
    period[np.concatenate([first[1:], [True]])] = np.nan  # across replays: not back to back
    return {
        "entry - previous kernel's end (<0: PDL overlap)": entry - prev_last,
        "ready - previous kernel's end (PDL release)": ready - prev_last,
        "kernel: ready -> last block done": last - ready,
        "call period: ready -> next call's ready": period,
    }


def clock_offset_ns(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(offset of b's global timer against a's, one-way latency), NTP-style from matched calls:
    min(b's data arrived - a's data sent) = latency + offset, and the reverse = latency - offset."""
    sent = lambda r: np.where(r["ns"][:, _ev("sent")] > 0, r["ns"][:, _ev("sent")],  # noqa: E731
                              r["ns"][:, _ev("arrived")]).astype(np.float64)
    got = lambda r: r["ns"][:, _ev("wait_end")].astype(np.float64)  # noqa: E731
    ok = (got(a) > 0) & (got(b) > 0)
    if not ok.any():
        return float("nan"), float("nan")
    ab = (got(b) - sent(a))[ok].min()
    ba = (got(a) - sent(b))[ok].min()
    return float((ab - ba) / 2), float((ab + ba) / 2)


def _matched(per_rank: list[np.ndarray]) -> list[np.ndarray]:
    """Each rank's records restricted to the calls (flags) every rank recorded, in flag order."""
    common = set(per_rank[0]["flag"].tolist())
    for r in per_rank[1:]:
        common &= set(r["flag"].tolist())
    out = []
    for r in per_rank:
        keep = np.isin(r["flag"], list(common))
        rr = r[keep]
        out.append(rr[np.argsort(rr["flag"], kind="stable")])
    return out


def analyse(case: TraceCase, results: list[dict]) -> dict:
    """Per-rank phase medians (and means of the global-timer ones), cross-rank offsets and skew."""
    recs = [r["records"] for r in results]
    out = {"case": case.name, "op": case.op, "table": case.table, "size": case.size, "quant": case.quant,
           "attn_tp": case.attn_tp,
           "backend": results[0]["backend"], "algorithm": results[0]["algorithm"],
           "us_per_call_trace_build": max(r["us_per_call"] for r in results),
           "calls": [int(len(r)) for r in recs], "blocks": [int(np.median(r["blocks"])) if len(r) else 0
                                                             for r in recs],
           "ranks": []}
    for rank, rec in enumerate(recs):
        if not len(rec):
            out["ranks"].append({"rank": rank, "error": "no records"})
            continue
        rate = clock_rate_ghz(rec)
        spans = phase_spans(rec, rate)
        glob = global_phases(rec)
        out["ranks"].append({
            "rank": rank, "sm_clock_ghz": rate, "timer_tick_ns": timer_tick_ns(rec),
            "phases_median_ns": {k: _med(v) for k, v in spans.items()},
            "block0_ready_to_exit_median_ns": _med(sum(np.nan_to_num(v) for v in spans.values())
                                                    - np.nan_to_num(spans[PHASES[0][0]])),
            "global_median_ns": {k: _med(v) for k, v in glob.items()},
            "global_mean_ns": {k: _mean(v) for k, v in glob.items()},
        })
    matched = _matched(recs) if all(len(r) for r in recs) else []
    if matched and len(matched[0]):
        cross = []
        for rank in range(1, len(matched)):
            offset, latency = clock_offset_ns(matched[0], matched[rank])
            ready = lambda r: r["ns"][:, _ev("ready")].astype(np.float64)  # noqa: E731
            skew = ready(matched[rank]) - offset - ready(matched[0])
            cross.append({"rank": rank, "timer_offset_ns": offset, "one_way_latency_ns": latency,
                          "ready_minus_rank0_median_ns": _med(skew), "ready_minus_rank0_mean_ns": _mean(skew)})
        out["cross_rank"] = cross
    return out


def format_report(analyses: list[dict]) -> str:
    w = 14  # column width per rank
    lines = []
    for a in analyses:
        lines.append(f"== {a['case']}  ({a['backend']} / {a['algorithm']}, blocks {a['blocks']}, "
                     f"{a['us_per_call_trace_build']:.2f} us/call in the trace build, calls {a['calls']})")
        ok = [r for r in a["ranks"] if "error" not in r]
        if not ok:
            lines.append("   no records")
            continue
        row = lambda label, cells: f"   {label:<52}" + "".join(c.rjust(w) for c in cells)  # noqa: E731
        lines.append(row("phase (block 0 thread 0), median ns", [f"rank {r['rank']}" for r in ok]))
        for name, *_ in PHASES:
            lines.append(row(name, [f"{r['phases_median_ns'][name]:.0f}" for r in ok]))
        lines.append(row("sum: ready -> block 0 exit", [f"{r['block0_ready_to_exit_median_ns']:.0f}" for r in ok]))
        lines.append(row("global timer, ns: median/mean", []))
        for key in ok[0]["global_median_ns"]:
            lines.append(row(key, [f"{r['global_median_ns'][key]:.0f}/{r['global_mean_ns'][key]:.0f}" for r in ok]))
        lines.append("   " + ", ".join(f"rank {r['rank']}: SM {r['sm_clock_ghz']:.2f} GHz, timer tick "
                                       f"{r['timer_tick_ns']:.0f} ns" for r in ok))
        for c in a.get("cross_rank", []):
            lines.append(f"   rank {c['rank']} vs 0: timer offset {c['timer_offset_ns']:.0f} ns, one-way latency "
                         f"{c['one_way_latency_ns']:.0f} ns, starts later by {c['ready_minus_rank0_median_ns']:.0f} "
                         f"(median) / {c['ready_minus_rank0_mean_ns']:.0f} (mean) ns")
    return "\n".join(lines)


def run_all(cases=CASES) -> list[dict]:
    """Worker entry (every rank): every case's records; rank 0's return value is the analysis."""
    out = []
    for case in cases:
        mine = record_case(case)
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        out.append(analyse(case, gathered))
    return out

