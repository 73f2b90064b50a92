"""Model benchmark: decode steps of a Hugging Face MoE model (hybridcomm.hf) per backend,
checked against the unmodified single-device model.

One worker call per (config, layout) runs every tokens point: the rank's shard is built once
(random weights drawn on the device), then per point and backend: prefill, greedy decode
steps, the step time and the communication share. On CUDA each decode step is a CUDA graph:
the NCCL paths ("nccl": all-gather / reduce-scatter / all-reduce on ordinary tensors;
"nccl_symm": the same on buffers registered with NCCL as symmetric windows) are captured with
their exact host counts, hybridcomm ("auto") once per capacity bucket with device-side counts;
the step time is the median replay time, max over ranks, and the communication share is the
time of the step's transitions alone (the same gather_tokens + scatter_tokens per layer,
captured on their own) over the step time. On CPU (gloo) steps run eagerly and are timed by
wall clock (a development path, not a speed claim), and the NCCL rows are skipped.

The check comes last, after the shard is freed: the whole single-device model (one per DP
group, on its attn-TP rank 0) must fit on one GPU (hf/memory.py picks DeepSeek-V3's layers
so). Every sequence counts for the top-1 agreement; the logits of the first KEEP sequences
per DP group and point give the relative error (keeping all of them costs GBs of host memory
at 256 sequences and a 150k vocabulary).
"""

from __future__ import annotations

import datetime
import gc
import statistics
import sys
import time

import torch
import torch.distributed as dist

from ..communicator import Communicator
from ..workspace import DEFAULT_AREA_BYTES
from .layer import LABELS, _worker_device, parse_layout
from .timing import graph_us, max_over_ranks

PROMPT = 8
REPLAYS = 50
KEEP = 4  # sequences per DP group whose logits are kept for the relative error
HOST_COUNTS = ("nccl", "nccl_symm")  # backends that read counts on the host: one graph per count mix
NCCL_PATHS = ("nccl", "nccl-symm")  # labels of the baselines the speed-up is measured against
UNEVEN_HIGH = 16  # the uneven mix: one DP group with this many tokens, the others with 1
_communicators: dict[tuple, Communicator] = {}  # per worker: process groups and workspaces are costly


def workspace_for(layout, max_tokens: int, hidden: int, dtype: torch.dtype) -> int:
    """Workspace bytes per peer so that no transition of the run falls back to NCCL (which cannot
    read device-side counts inside a graph): a scatter_tokens input holds attn_dp * capacity rows,
    sent as LL packets (2 bytes per byte)."""
    need = 2 * layout.attn_dp * max_tokens * hidden * torch.finfo(dtype).bits // 8
    size = DEFAULT_AREA_BYTES
    while size < need:
        size *= 2
    return size


def counts_for(layout, item) -> list[int] | None:
    """A tokens item -> tokens per DP group, or None when it does not apply to the layout.
    An int: that many on every group; a list: one count per group; "uneven": UNEVEN_HIGH on
    the first group and 1 on the others (layouts with several DP groups)."""
    dp = layout.attn_dp
    if item == "uneven":
        return [UNEVEN_HIGH] + [1] * (dp - 1) if dp > 1 else None
    if isinstance(item, int):
        return [item] * dp
    return [int(t) for t in item] if len(item) == dp else None


class Phases:
    """Seconds per phase of a worker call (rank 0 prints them as they end)."""

    def __init__(self, label: str):
        self.label, self.start, self.seconds = label, time.perf_counter(), {}

    def done(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(now - self.start, 2)
        self.start = now
        if dist.get_rank() == 0:
            print(f"  [{self.label}] {name}: {self.seconds[name]:.1f} s", file=sys.stderr, flush=True)


def _communicator(layout, backend: str, device, workspace_bytes: int):
    """The worker's Communicator for `backend`, or the reason it cannot run here (a str)."""
    if device.type == "cpu" and backend in HOST_COUNTS:
        return f"{backend} needs CUDA GPUs (on CPU every op runs on the reference backend)"
    key = (layout, backend, workspace_bytes)
    if key not in _communicators:
        extra = {"workspace_bytes": workspace_bytes} if device.type == "cuda" else {}
        try:
            _communicators[key] = Communicator(layout, device=device, backend=backend, **extra)
        except Exception as e:  # e.g. NCCL without symmetric registration: a skipped row says why
            return f"{type(e).__name__}: {e}"
    return _communicators[key]


def _transitions_us(comm, layers: int, hidden: int, rows: int, dp_counts, dtype, device_counts: bool,
                    graphs: bool) -> float:
    """µs of one step's communication alone: per layer a fused gather_tokens and a scatter_tokens
    on random rows of the step's shapes, as one CUDA graph."""
    device = comm.device
    sizes = torch.tensor(dp_counts, dtype=torch.int32, device=device) if device_counts else list(dp_counts)
    x = torch.randn(rows, hidden, dtype=dtype, device=device)
    w = torch.ones(hidden, dtype=dtype, device=device)
    gathered = comm.layout.attn_dp * rows if device_counts else sum(dp_counts)
    y = torch.randn(gathered, hidden, dtype=dtype, device=device)

    def step():
        for _ in range(layers):
            comm.gather_tokens(x, sizes, residual=x, norm_weight=w, eps=1e-6)
            comm.scatter_tokens(y, sizes)
    if graphs:
        return graph_us(step, 1)
    times = []
    for _ in range(5):  # eager: wall clock, the device drained before and after
        _synchronize(device)
        dist.barrier()
        start = time.perf_counter()
        step()
        _synchronize(device)
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def _synchronize(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _time_backend(model, comm, backend: str, counts: list[int], prompts, steps: int, slots: int, graphs: bool):
    """One backend at one point: decode, then time. Returns (row, (fed, kept logits, top-1 ids))."""
    from .. import hf
    from ..hf import check
    from ..hf.driver import bucket

    model.comm = comm  # one shard, every backend
    device = comm.device
    device_counts = graphs and backend not in HOST_COUNTS
    decoder = hf.Decoder(model, slots=slots, max_len=PROMPT + steps + 1, graphs=graphs, device_counts=device_counts)
    stamps = []

    def on_step(i):
        _synchronize(device)
        stamps.append(time.perf_counter())

    dist.barrier()
    start = time.perf_counter()
    fed, logits = check.decode(decoder, prompts, [list(counts)] * steps, on_step)
    if graphs:
        step_us = statistics.median(decoder.replay_us(counts, REPLAYS) for _ in range(3))
    else:  # the first interval holds the prefill
        intervals = zip(stamps, stamps[1:]) if len(stamps) > 1 else [(start, stamps[0])]
        step_us = statistics.median(b - a for a, b in intervals) * 1e6
    dp = comm.layout.coords(comm.rank).attn_dp_rank
    rows_in = bucket(max(counts), decoder.slots) if device_counts else counts[dp]
    comm_us = _transitions_us(comm, len(model.layers), model.config.hidden_size, rows_in, counts, model.dtype,
                              device_counts, graphs)
    del decoder
    step_us, comm_us = max_over_ranks([step_us, comm_us])
    row = {"backend": LABELS.get(backend, backend), "step_us": step_us, "comm_us": comm_us,
           "tokens_per_s": sum(counts) / step_us * 1e6}
    note = getattr(comm.backends.get(backend), "note", None)  # nccl_symm: registered without symmetric windows
    if note:
        row["note"] = note
    kept = [t if i < KEEP else None for i, t in enumerate(logits)]
    return row, (fed, kept, [t.argmax(-1) for t in logits])


AUTO_LAYERS = ("deepseek-v3",)  # configs whose default layer count is what one GPU holds with the reference


def _layers(config_name: str, layers: int | None, device, dtype) -> int | None:
    """--layers, else for configs in AUTO_LAYERS on a GPU: as many as the single-device
    reference allows (hf/memory.py)."""
    from ..hf import memory

    if layers is None and config_name in AUTO_LAYERS and device.type == "cuda":
        return memory.fit_layers(config_name, torch.cuda.get_device_properties(device).total_memory, dtype)
    return layers


def run_model_bench(config_name: str, layers: int | None, layout_name: str, moe_tp: int | None,
                    points: list[list[int]], backends: list[str], steps: int, dtype_name: str,
                    check_logits: bool, seed: int, eager: bool = False) -> dict:
    """On every rank of an SpmdPool: every point (tokens per DP group) of one layout. Returns the
    same dict on every rank: {"results": one run per point, "phases": seconds per phase}.
    eager: no CUDA graphs on GPUs (steps timed by wall clock, like CPU runs)."""
    from .. import hf
    from ..hf import check, configs

    layout = parse_layout(layout_name, moe_tp)
    device = _worker_device()
    graphs = device.type == "cuda" and not eager
    dtype = getattr(torch, dtype_name)
    config = configs.make(config_name, _layers(config_name, layers, device, dtype))
    coords = layout.coords(dist.get_rank())
    phases = Phases(f"{config_name} {layout.name}")
    slots = max(1, max(max(c) for c in points))  # graph capacity buckets never exceed the slots
    workspace = workspace_for(layout, slots, config.hidden_size, dtype)
    comms = {b: _communicator(layout, b, device, workspace) for b in backends}
    usable = [b for b in backends if isinstance(comms[b], Communicator)]
    phases.done("communicators")
    model = hf.from_config(config, comms[usable[0]], seed=seed, dtype=dtype) if usable else None
    phases.done(f"shard of {config.num_hidden_layers} layers built")
    runs, outputs = [], []
    for counts in points:
        prompts = check.dp_prompts(config.vocab_size, counts, PROMPT, coords.attn_dp_rank, seed)
        rows, kept = [], {}
        for backend in backends:
            if backend not in usable:
                rows.append({"backend": LABELS.get(backend, backend), "skipped": comms[backend]})
                continue
            row, outs = _time_backend(model, comms[backend], backend, counts, prompts, steps, slots, graphs)
            rows.append(row)
            kept[row["backend"]] = outs
        runs.append({"config": config_name, "layers": config.num_hidden_layers, "layout": layout.name,
                     "tokens_per_dp": list(counts), "dtype": dtype_name, "graphs": graphs, "steps": steps,
                     "backends": rows})
        outputs.append((prompts, kept))
        phases.done(f"tokens/dp {counts}")
    del model
    _free(device)
    if check_logits and usable:
        _check(config, seed, device, dtype, runs, outputs, coords)
        phases.done("checked against the single-device model")
    _release_registered(comms, device)
    return {"results": runs, "phases": phases.seconds}


def _release_registered(comms: dict, device) -> None:
    """Close the communicators that hold NCCL-registered memory, on every rank at this same
    point: releasing a symmetric window is collective, so it must not wait for process exit."""
    _synchronize(device)  # no kernel may still use the buffers
    for backend, comm in comms.items():
        if backend == "nccl_symm" and isinstance(comm, Communicator):
            comm.close()
            _communicators.pop(next(k for k, v in _communicators.items() if v is comm))
    _free(device)


def _check(config, seed, device, dtype, runs, outputs, coords) -> None:
    """Errors of every backend at every point against the single-device model; one reference
    per DP group (on its attn-TP rank 0), max over ranks."""
    from .. import hf
    from ..hf import check

    stats = []
    reference = hf.reference_model(config, device=device, dtype=dtype, seed=seed) if coords.attn_tp_rank == 0 else None
    for run, (prompts, kept) in zip(runs, outputs):
        for row in run["backends"]:
            if "skipped" in row:
                continue
            if reference is not None:
                fed, logits, top1 = kept[row["backend"]]
                r = check.compare(reference, prompts, fed, logits, top1)
                stats += [r["max_rel_error"], -r["top1_agreement"]]
            else:
                stats += [0.0, -1.0]
    del reference
    _free(device)
    worst = iter(max_over_ranks(stats))
    for run in runs:
        for row in run["backends"]:
            if "skipped" not in row:
                row["max_rel_error"], row["top1_agreement"] = next(worst), -next(worst)


def bench_model(configs, layouts, tokens_list, world_size: int, device: str, backends, steps: int,
                dtype: str, layers: int | None = None, check_logits: bool = True, seed: int = 0,
                eager: bool = False, timeout_s: float = 900.0) -> dict:
    """Every config x layout in one pool of `world_size` ranks, one worker call (with its own
    deadline) each; progress on stderr."""
    from ..layout import Layout
    from ..spmd import SpmdPool

    jobs = []
    for name in layouts:
        layout = Layout.parse(name)
        if layout.world_size != world_size:
            raise ValueError(f"layout {name} has {layout.world_size} ranks, world_size is {world_size}")
        points = [c for c in (counts_for(layout, t) for t in tokens_list) if c is not None]
        skipped = [t for t in tokens_list if counts_for(layout, t) is None]
        if skipped:
            print(f"[model] {layout.name}: skipping tokens {skipped} ({layout.attn_dp} DP groups)", file=sys.stderr)
        if points:
            jobs += [(config, name, layout.moe_tp, points) for config in configs]
    results, phases, failed = [], [], []
    with SpmdPool(world_size, device) as pool:
        for i, (config, name, moe_tp, points) in enumerate(jobs, 1):
            print(f"[model {i}/{len(jobs)}] {config} {name} tokens/dp {points} ...", file=sys.stderr, flush=True)
            try:
                out = pool.run(run_model_bench, config, layers, name, moe_tp, points, list(backends), steps, dtype,
                               check_logits, seed, eager, timeout=timeout_s)[0]
            except Exception as e:  # a deadline or a rank's error ends the pool: keep what finished
                failed.append({"config": config, "layout": name, "error": f"{type(e).__name__}: {e}"[:2000]})
                break
            results += out["results"]
            phases.append({"config": config, "layout": name, "seconds": out["phases"]})
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "device": device, "world_size": world_size, "results": results,
            "phases": phases, "failed": failed}


def _baseline_us(rows) -> float | None:
    """The best NCCL path's step time, or (no NCCL row) the first row's."""
    timed = [b for b in rows if "skipped" not in b]
    nccl = [b["step_us"] for b in timed if b["backend"] in NCCL_PATHS]
    return min(nccl) if nccl else (timed[0]["step_us"] if timed else None)


def format_model_table(results: dict) -> str:
    header = (f"{'config':<16} {'layout':<16} {'tokens/dp':>10} {'backend':>11} {'step us':>10} {'speed-up':>9} "
              f"{'tokens/s':>10} {'comm %':>7} {'max rel err':>12} {'top-1':>6}")
    lines = [header, "-" * len(header)]
    for run in results["results"]:
        base = _baseline_us(run["backends"])
        tokens = ",".join(map(str, run["tokens_per_dp"]))
        for b in run["backends"]:
            lead = f"{run['config']:<16} {run['layout']:<16} {tokens:>10} {b['backend']:>11} "
            if "skipped" in b:
                lines.append(lead + f"skipped: {b['skipped']}")
                continue
            share = 100 * b["comm_us"] / b["step_us"]
            lines.append(lead + f"{b['step_us']:>10.1f} {base / b['step_us']:>8.2f}x {b['tokens_per_s']:>10.1f} "
                         f"{share:>7.1f} {b.get('max_rel_error', float('nan')):>12.3g} "
                         f"{b.get('top1_agreement', float('nan')):>6.3f}")
    notes = {f"{b['backend']}: {b['note']}" for run in results["results"] for b in run["backends"] if "note" in b}
    lines += sorted(notes)
    lines += [f"FAILED {f['config']} {f['layout']}: {f['error'].splitlines()[0]}" for f in results.get("failed", [])]
    lines.append("speed-up: the best NCCL path's step time (nccl or nccl-symm) over the row's; comm %: the "
                 "step's transitions timed alone over the step")
    return "\n".join(lines)


FP32_TOLERANCE = 1e-5  # relative, against the single-device model


def verdict(results: dict) -> str:
    """One line per dtype: fp32 runs must match to FP32_TOLERANCE with every top-1 equal; 16-bit
    runs are reported (rounding differs between a sharded and a single-device computation)."""
    runs = [(r["dtype"], b) for r in results["results"] for b in r["backends"] if "max_rel_error" in b]
    if not runs:
        return "check: no checked rows (--no-check, or no run finished)"
    worst = max(b["max_rel_error"] for _, b in runs)
    top1 = min(b["top1_agreement"] for _, b in runs)
    if all(d == "float32" for d, _ in runs):
        ok = worst < FP32_TOLERANCE and top1 == 1.0
        return (f"check against the single-device model: {'PASS' if ok else 'FAIL'} (max relative error "
                f"{worst:.2e}, tolerance {FP32_TOLERANCE:g}; top-1 agreement {top1:.3f})")
    return f"check against the single-device model: max relative error {worst:.3g}, top-1 agreement {top1:.3f}"
