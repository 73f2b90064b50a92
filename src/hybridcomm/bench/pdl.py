"""`hybridcomm bench pdl`: what programmatic dependent launch (csrc/pdl.cuh) saves when one of
our kernels follows another kernel on the stream.

A sequence is "producer -> our op", the op on the kernel backend (layout dp<world>, one GPU per
rank), timed with our kernels launched with PDL and without (the backend's `pdl` flag), in two
modes:
  graph  `calls` sequences captured back to back in one CUDA graph, replayed (bench.timing)
  eager  the same sequences launched one by one, queued behind a spin kernel: the device time
         between two events around them, without the host's launch cost (the same launch call
         with PDL on or off; `bench ops` reports it). A run whose queue ran dry is repeated
         with a longer spin, so the device never waits for the host inside the timed part.
Each setting is timed twice, in the order off, on, on, off; median of its repeats per rank,
max over ranks, µs per sequence; saving = PDL off - PDL on.

What can overlap: a kernel launched with PDL may start once every block of the kernel before
it has triggered (griddepcontrol.launch_dependents) or exited; its griddepcontrol.wait then
waits for that kernel's completion and memory flush (PTX ISA, griddepcontrol). torch's
elementwise kernels never trigger, nor do cuBLAS's as far as we know (the numbers show what
they do): after them our kernel starts only once their last block has exited, so the saving is
the launch and block scheduling that overlap the grid's completion and memory flush. Our own
kernels trigger right after their wait, so a kernel of ours after one of ours is resident and
waiting long before its producer ends.
"""

from __future__ import annotations

import math
import statistics
import sys
from typing import Callable

import torch
import torch.distributed as dist

from ..communicator import Communicator
from ..layout import Layout
from . import timing

DTYPE = torch.bfloat16
HIDDEN = 4096  # row width of the token ops
KiB = 1 << 10
CALLS = 40  # sequences per graph and per eager run
REPLAYS = 5  # graph replays per repeat
SPIN_CYCLES = 10_000_000  # first spin before an eager run (~5 ms): doubled while the queue runs dry
MAX_SPIN_CYCLES = 64 * SPIN_CYCLES
ORDER = (False, True, True, False)  # PDL off / on, ABBA: a drift in clocks hits both alike
MODES = ("graph", "eager")

Call = Callable[[], object]


# -- producers: name -> builder(comm) of a zero-argument call; None: the op alone -------------------
def _gemm(m: int, k: int, n: int):
    def build(comm: Communicator) -> Call:
        a = torch.randn(m, k, dtype=DTYPE, device=comm.device)
        w = torch.randn(k, n, dtype=DTYPE, device=comm.device) / math.sqrt(k)
        out = torch.empty(m, n, dtype=DTYPE, device=comm.device)
        return lambda: torch.mm(a, w, out=out)
    return build


def _elementwise(comm: Communicator) -> Call:
    x = torch.randn(16, HIDDEN, dtype=DTYPE, device=comm.device)
    out = torch.empty_like(x)
    return lambda: torch.mul(x, 0.5, out=out)


def _ours(comm: Communicator) -> Call:
    x = torch.randn(1, HIDDEN, dtype=DTYPE, device=comm.device)
    counts = [1] * comm.layout.attn_dp
    return lambda: comm.gather_tokens(x, counts)


PRODUCERS: dict[str, Callable[[Communicator], Call] | None] = {
    "none": None,  # the op back to back with itself (one of ours after one of ours)
    "gemm_16x4096x4096": _gemm(16, 4096, 4096),  # a decode step's projection, 16 tokens
    "gemm_16x2048x768": _gemm(16, 2048, 768),  # an MoE expert's projection
    "elementwise_16x4096": _elementwise,  # a tiny torch kernel
    "hc_gather_tokens_1": _ours,  # one of our kernels (it triggers its dependents at once)
}


# -- ops: label -> (builder(comm, size), size) -------------------------------------------------------
def _all_reduce(comm: Communicator, nbytes: int) -> Call:
    x = torch.randn(nbytes // DTYPE.itemsize, dtype=DTYPE, device=comm.device)
    return lambda: comm.all_reduce(x)


def _gather_tokens(comm: Communicator, tokens: int) -> Call:
    x = torch.randn(tokens, HIDDEN, dtype=DTYPE, device=comm.device)
    counts = [tokens] * comm.layout.attn_dp
    return lambda: comm.gather_tokens(x, counts)


OPS = {"all_reduce 2K": (_all_reduce, 2 * KiB), "all_reduce 128K": (_all_reduce, 128 * KiB),
       "gather_tokens 1": (_gather_tokens, 1), "gather_tokens 16": (_gather_tokens, 16)}


# -- timers: µs per call on this rank, one value per repeat ------------------------------------------
def _graph_times(call: Call, calls: int, repeats: int) -> list[float]:
    return timing.graph_times(call, calls, replays=REPLAYS, repeats=repeats)[0]


def _eager_times(call: Call, calls: int, repeats: int) -> list[float]:
    """Device µs per call of `calls` eager calls queued behind a spin kernel, so the host's launch
    cost stays out. The ranks agree after each run whether any queue ran dry (the device reached
    the first event before the host had queued the last call); then the run is repeated with a
    spin twice as long, on every rank alike (the calls are collective)."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    spin, times = SPIN_CYCLES, []
    while len(times) < repeats:
        dist.barrier()
        torch.cuda.synchronize()
        torch.cuda._sleep(spin)
        call()  # untimed: the ranks' devices leave this call together
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(calls):
            call()
        end.record()
        dry = begin.query()
        end.synchronize()
        if timing.max_over_ranks([float(dry)])[0]:
            spin *= 2
            if spin > MAX_SPIN_CYCLES:
                raise RuntimeError("bench pdl eager: the device caught up with the host even behind a long spin "
                                   "kernel; does a call synchronise with the host?")
            continue
        times.append(begin.elapsed_time(end) * 1e3 / calls)
    return times


TIMERS = {"graph": _graph_times, "eager": _eager_times}


def _sequence(producer: Call | None, op: Call) -> Call:
    if producer is None:
        return op

    def run():
        producer()
        return op()
    return run


def sweep_pdl(calls: int = CALLS, repeats: int = timing.REPEATS) -> dict:
    """Worker entry (every rank, CUDA): one record per (mode, producer, op)."""
    world = dist.get_world_size()
    comm = Communicator(Layout(world), backend="nvlink")
    nvlink = comm.backends["nvlink"]
    default_pdl = nvlink.pdl
    producers = {name: build(comm) for name, build in PRODUCERS.items() if build is not None}
    ops = {label: build(comm, size) for label, (build, size) in OPS.items()}
    choices = {}
    for label, op in ops.items():  # which kernel runs each op (the table's choice on our backend)
        op()
        choices[label] = f"{comm.last_choice.backend}/{comm.last_choice.algorithm}"
    records, alone = [], {}
    for mode in MODES:
        timer = TIMERS[mode]
        nvlink.pdl = False  # a producer alone runs without PDL (ours included)
        names = list(producers)
        for name, us in zip(names, timing.max_over_ranks([statistics.median(timer(producers[n], calls, repeats))
                                                            for n in names])):
            alone[(mode, name)] = us
        for producer in PRODUCERS:
            for label, op in ops.items():
                times: dict[bool, list[float]] = {False: [], True: []}
                for pdl in ORDER:
                    nvlink.pdl = pdl
                    times[pdl] += timer(_sequence(producers.get(producer), op), calls, repeats)
                off, on = timing.max_over_ranks([statistics.median(times[False]), statistics.median(times[True])])
                records.append({"mode": mode, "producer": producer, "op": label, "kernel": choices[label],
                                "producer_us": alone.get((mode, producer)), "pdl_off_us": off, "pdl_on_us": on,
                                "saving_us": off - on})
                if dist.get_rank() == 0:
                    print(f"[pdl] {mode:<5} {producer:<20} -> {label:<16} off {off:7.2f} us  on {on:7.2f} us  "
                          f"saving {off - on:6.2f} us", file=sys.stderr, flush=True)
    nvlink.pdl = default_pdl
    comm.close()
    return {"environment": timing.environment(), "layout": comm.layout.name, "dtype": str(DTYPE),
            "hidden": HIDDEN, "calls": calls, "repeats": repeats, "records": records}


def bench_pdl(world_size: int, timeout_s: float = 900.0) -> dict:
    from ..spmd import SpmdPool

    with SpmdPool(world_size, "cuda") as pool:
        return pool.run(sweep_pdl, timeout=timeout_s)[0]


# -- report ---------------------------------------------------------------------------------------------
COLUMNS = (("mode", 5, "{}"), ("producer", 20, "{}"), ("op", 16, "{}"), ("kernel", 22, "{}"),
           ("producer_us", 11, "{:.2f}"), ("pdl_off_us", 10, "{:.2f}"), ("pdl_on_us", 10, "{:.2f}"),
           ("saving_us", 9, "{:.2f}"), ("saving_%", 8, "{:.1f}"))


def _cells(record: dict) -> list[str]:
    values = dict(record, **{"saving_%": 100.0 * record["saving_us"] / record["pdl_off_us"]})
    return ["-" if values[name] is None else fmt.format(values[name]) for name, _, fmt in COLUMNS]


def pdl_table(results: dict) -> str:
    """An nccl-tests-like text table: '#' header lines, one aligned row per record."""
    header = "  ".join(f"{name:>{width}}" for name, width, _ in COLUMNS)
    lines = [f"# bench pdl: {results['layout']}, {results['dtype']}, hidden {results['hidden']}, "
             f"{results['calls']} sequences per run, median of {results['repeats']}, max over ranks",
             "# " + " | ".join(f"{k}: {v}" for k, v in results["environment"].items()),
             "# µs per sequence 'producer -> op'; producer_us: the producer alone (PDL off); "
             "saving = pdl_off - pdl_on", "#", "# " + header]
    lines += ["  " + "  ".join(f"{cell:>{width}}" for cell, (_, width, _) in zip(_cells(r), COLUMNS))
              for r in results["records"]]
    return "\n".join(lines)
