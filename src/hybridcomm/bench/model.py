"""Model benchmark: decode steps of a Hugging Face MoE model (hybridcomm.hf) per backend,
checked against the unmodified single-device model.

One worker call per (config, layout) runs every tokens point: the rank's shard is built once
(random weights drawn on the device), then per point and backend: prefill, greedy decode
steps, the step time and the communication share. On GPUs `bench model` compiles the shard's
compute regions by default (ParallelCausalLM.compile: engines fuse what transformers' modules
launch as ~100 kernels a layer; `--no-compile` for the modules as they are), the same shard for
every backend. On CUDA each decode step is a CUDA graph:
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
at 256 sequences and a 150k vocabulary). A 16-bit run's kept sequences are then also compared
with the single-device model in fp32, beside the 16-bit single-device model's own error against
it: the noise floor of 16-bit routing (hf/check.py), without which DeepSeek-V3's bf16 error
against one device reads like a bug. It runs where the fp32 model fits one GPU (DeepSeek-V3:
2 layers on an H200, 1 on an H100).
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
COMPUTE_NOTES = {True: "compute: each layer's attention and MoE regions compiled (torch.compile; "
                        "ParallelCausalLM.compile), the same model on every path",
                 False: "compute: transformers' modules as they are (~100 kernels a layer; --compile fuses them)"}
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
                    check_logits: bool, seed: int, eager: bool = False, compiled: bool = False) -> dict:
    """On every rank of an SpmdPool: every point (tokens per DP group) of one layout. Returns the
    same dict on every rank: {"results": one run per point, "phases": seconds per phase}.
    eager: no CUDA graphs on GPUs (steps timed by wall clock, like CPU runs). compiled: the
    layers' compute regions through torch.compile (ParallelCausalLM.compile), for every backend."""
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
    if model is not None and compiled:
        model.compile()
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
                     "tokens_per_dp": list(counts), "dtype": dtype_name, "graphs": graphs, "compiled": compiled,
                     "steps": steps, "backends": rows})
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
    per DP group (on its attn-TP rank 0), max over ranks. 16-bit runs are also compared with the
    single-device model in fp32, beside that 16-bit model's own error against it (the noise
    floor, hf/check.py), where the fp32 model fits one device."""
    from .. import hf
    from ..hf import check

    holder = coords.attn_tp_rank == 0
    rows = [(outputs[i][0], outputs[i][1][row["backend"]], row)  # (prompts, (fed, logits, top-1), row)
            for i, run in enumerate(runs) for row in run["backends"] if "skipped" not in row]
    floor = _floor_note(config, device) if dtype != torch.float32 else None
    to_fp32 = dtype != torch.float32 and floor is None
    stats, singles = [], []
    reference = hf.reference_model(config, device=device, dtype=dtype, seed=seed) if holder else None
    for prompts, (fed, logits, top1), _ in rows:
        if reference is None:
            stats += _NEUTRAL
            continue
        stats += _stats(check.compare(reference, prompts, fed, logits, top1))
        if to_fp32:  # the 16-bit single-device logits of the kept sequences, for the floor
            k = _kept(logits)
            singles.append(list(check.reference_logits(reference, prompts[:k], fed[:k])))
    del reference
    _free(device)
    if to_fp32:
        reference32 = check.fp32_reference(config, device, seed) if holder else None
        for i, (prompts, (fed, logits, _), _) in enumerate(rows):
            if reference32 is None:
                stats += _NEUTRAL * 2
                continue
            k = _kept(logits)
            r = check.against_fp32(reference32, prompts[:k], fed[:k], logits[:k], singles[i])
            stats += _stats(r["ours"]) + _stats(r["single_device"])
        del reference32
        _free(device)
    worst = iter(max_over_ranks(stats))
    for *_, row in rows:
        row.update(_unstats(worst))
    for *_, row in rows:
        if to_fp32:
            row["vs_fp32"] = {side: _unstats(worst) for side in ("ours", "single_device")}
        elif floor is not None:
            row["vs_fp32"] = {"skipped": floor}


# a compare_logits dict as values to take the max of over ranks (top-1 negated: its worst is its min)
_NEUTRAL = [0.0, -1.0, 0.0]  # what a rank without a reference contributes


def _stats(errors: dict) -> list[float]:
    return [errors["max_rel_error"], -errors["top1_agreement"], errors["median_rel_error"]]


def _unstats(worst) -> dict:
    return {"max_rel_error": next(worst), "top1_agreement": -next(worst), "median_rel_error": next(worst)}


def _kept(logits) -> int:
    """How many leading sequences kept their logits (the relative error's)."""
    return sum(t is not None for t in logits)


def _floor_note(config, device) -> str | None:
    """Why a 16-bit run is not compared with the fp32 single-device model (the same answer on
    every rank), or None."""
    from ..hf import memory

    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        if not memory.fits(config, torch.float32, total):
            need = memory.parameter_bytes(config, torch.float32) / 2**30
            return (f"the fp32 single-device model ({need:.0f} GiB) does not fit one GPU: fewer --layers "
                    f"give the noise floor")
    return None


def bench_model(configs, layouts, tokens_list, world_size: int, device: str, backends, steps: int,
                dtype: str, layers: int | None = None, check_logits: bool = True, seed: int = 0,
                eager: bool = False, timeout_s: float = 900.0, compiled: bool = False) -> dict:
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
                               check_logits, seed, eager, compiled, timeout=timeout_s)[0]
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
    fp32 = any("ours" in b.get("vs_fp32", {}) for run in results["results"] for b in run["backends"])
    header = (f"{'config':<16} {'layout':<16} {'tokens/dp':>10} {'backend':>11} {'step us':>10} {'speed-up':>9} "
              f"{'tokens/s':>10} {'comm %':>7} {'max rel err':>12} {'top-1':>6}"
              + (f" {'fp32: ours':>12} {'1 device':>12}" if fp32 else ""))
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
                         f"{b.get('top1_agreement', float('nan')):>6.3f}" + (_fp32_columns(b) if fp32 else ""))
    notes = {f"{b['backend']}: {b['note']}" for run in results["results"] for b in run["backends"] if "note" in b}
    lines += sorted(notes)
    lines += [f"FAILED {f['config']} {f['layout']}: {f['error'].splitlines()[0]}" for f in results.get("failed", [])]
    lines.append("speed-up: the best NCCL path's step time (nccl or nccl-symm) over the row's; comm %: the "
                 "step's transitions timed alone over the step")
    lines += sorted({COMPUTE_NOTES[bool(run.get("compiled"))] for run in results["results"]})
    lines += sorted({f"not compared with fp32: {b['vs_fp32']['skipped']}" for run in results["results"]
                     for b in run["backends"] if "skipped" in b.get("vs_fp32", {})})
    if fp32:
        lines.append(FP32_NOTE)
    return "\n".join(lines)


FP32_NOTE = ("fp32: ours / 1 device: max rel err/top-1 of this run and of the single-device model in the same "
             "dtype, both against the single-device model in fp32 on the kept sequences: the second is the noise "
             "floor (hf/check.py); agreement is ours near it")


def _fp32_columns(row) -> str:
    cells = [row.get("vs_fp32", {}).get(side) for side in ("ours", "single_device")]
    return "".join(f" {c['max_rel_error']:>7.3g}/{c['top1_agreement']:.2f}" if c else f" {'':>12}" for c in cells)


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
    line = f"check against the single-device model: max relative error {worst:.3g}, top-1 agreement {top1:.3f}"
    floors = [b["vs_fp32"] for _, b in runs if "ours" in b.get("vs_fp32", {})]
    if floors:
        ours, single = ([f[side] for f in floors] for side in ("ours", "single_device"))
        line += (f"; against fp32: ours {_span(ours)}, the single-device model in the same dtype (noise floor) "
                 f"{_span(single)}")
    return line


def _span(errors: list[dict]) -> str:
    worst, median = max(e["max_rel_error"] for e in errors), max(e["median_rel_error"] for e in errors)
    return f"max rel err {worst:.3g} (median {median:.2g}), top-1 {min(e['top1_agreement'] for e in errors):.3f}"
