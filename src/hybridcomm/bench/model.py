"""Model benchmark: decode steps of a Hugging Face MoE model (hybridcomm.hf) per backend,
checked against the unmodified single-device model.

For every (layout, tokens per DP group) point and backend: prefill, then greedy decode
steps; the logits of every DP group's sequences are compared with the single-device model
(max relative error, top-1 agreement). On CUDA each decode step is a CUDA graph: the
"nccl" backend (what engines do today: all-gather / reduce-scatter / all-reduce through
NCCL) is captured with its exact host counts, hybridcomm ("auto") once per capacity bucket
with device-side counts; the step time is the median replay time, max over ranks, and the
communication share is the time of the step's transitions alone (the same
gather_tokens + scatter_tokens per layer, captured on their own) over the step time. On CPU
(gloo) steps run eagerly and are timed by wall clock: a development path, not a speed claim.
"""

from __future__ import annotations

import datetime
import statistics
import sys
import time

import torch
import torch.distributed as dist

from ..communicator import Communicator
from ..workspace import DEFAULT_AREA_BYTES
from .layer import LABELS, _worker_device, parse_layout, tokens_for
from .timing import graph_us, max_over_ranks

PROMPT = 8
REPLAYS = 50
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


def _communicator(layout, backend: str, device, workspace_bytes: int) -> Communicator:
    key = (layout, backend, workspace_bytes)
    if key not in _communicators:
        extra = {"workspace_bytes": workspace_bytes} if device.type == "cuda" else {}
        _communicators[key] = Communicator(layout, device=device, backend=backend, **extra)
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


def run_model_bench(config_name: str, layers: int | None, layout_name: str, moe_tp: int | None,
                    tokens_per_dp: list[int], backends: list[str], steps: int, dtype_name: str,
                    check_logits: bool, seed: int, max_tokens: int | None = None, eager: bool = False) -> dict:
    """On every rank of an SpmdPool; returns the same dict on every rank. eager: no CUDA graphs
    on GPUs (steps timed by wall clock, like CPU runs)."""
    from .. import hf
    from ..hf import check, configs
    from ..hf.driver import bucket

    layout = parse_layout(layout_name, moe_tp)
    device = _worker_device()
    graphs = device.type == "cuda" and not eager
    dtype = getattr(torch, dtype_name)
    config = configs.make(config_name, layers)
    rank = dist.get_rank()
    coords = layout.coords(rank)
    prompts = check.dp_prompts(config.vocab_size, tokens_per_dp, PROMPT, coords.attn_dp_rank, seed)
    schedule = [list(tokens_per_dp)] * steps
    model = None
    rows, outputs = [], {}
    slots = max(max(tokens_per_dp), 1)  # graph capacity buckets never exceed the slots
    workspace = workspace_for(layout, max(max_tokens or 0, slots), config.hidden_size, dtype)
    for backend in backends:
        comm = _communicator(layout, backend, device, workspace)
        if model is None:
            model = hf.from_config(config, comm, seed=seed, dtype=dtype)
        model.comm = comm  # one shard, every backend
        # graphs: hybridcomm reads device-side counts (one capture per bucket), NCCL needs host
        # counts (one capture per count mix); eager: exact host counts for every backend
        device_counts = graphs and backend != "nccl"
        decoder = hf.Decoder(model, slots=slots, max_len=PROMPT + steps + 1,
                             graphs=graphs, device_counts=device_counts)
        stamps = []

        def on_step(i):
            _synchronize(device)
            if rank == 0 and (i + 1) % max(1, steps // 4) == 0:
                print(f"  [{LABELS.get(backend, backend)}] step {i + 1}/{steps}", file=sys.stderr, flush=True)
            stamps.append(time.perf_counter())

        dist.barrier()
        start = time.perf_counter()
        outputs[backend] = check.decode(decoder, prompts, schedule, on_step)
        if graphs:
            step_us = statistics.median(decoder.replay_us(tokens_per_dp, REPLAYS) for _ in range(3))
        else:
            step_us = statistics.median(b - a for a, b in zip([start] + stamps, stamps)) * 1e6
            if len(stamps) > 1:  # the first interval holds the prefill
                step_us = statistics.median(b - a for a, b in zip(stamps, stamps[1:])) * 1e6
        rows_in = bucket(max(tokens_per_dp), decoder.slots) if device_counts else tokens_per_dp[coords.attn_dp_rank]
        comm_us = _transitions_us(comm, len(model.layers), config.hidden_size, rows_in, tokens_per_dp, dtype,
                                  device_counts, graphs)
        step_us, comm_us = max_over_ranks([step_us, comm_us])
        rows.append({"backend": LABELS.get(backend, backend), "step_us": step_us, "comm_us": comm_us,
                     "tokens_per_s": sum(tokens_per_dp) / step_us * 1e6})
        del decoder
    if check_logits:
        _check(config, seed, device, dtype, prompts, outputs, rows, coords)
    return {"config": config_name, "layers": config.num_hidden_layers, "layout": layout.name,
            "tokens_per_dp": list(tokens_per_dp), "dtype": dtype_name, "graphs": graphs, "steps": steps,
            "backends": rows}


def _check(config, seed, device, dtype, prompts, outputs, rows, coords) -> None:
    """Errors of every backend against the single-device model; one reference per DP group
    (on its attn-TP rank 0), max over ranks."""
    from .. import hf
    from ..hf import check

    stats = []
    reference = hf.reference_model(config, device=device, dtype=dtype, seed=seed) if coords.attn_tp_rank == 0 else None
    for row in rows:
        backend = next(b for b in outputs if LABELS.get(b, b) == row["backend"])
        if reference is not None:
            r = check.compare(reference, prompts, *outputs[backend])
            stats += [r["max_rel_error"], -r["top1_agreement"]]
        else:
            stats += [0.0, -1.0]
    del reference
    worst = max_over_ranks(stats)
    for i, row in enumerate(rows):
        row["max_rel_error"], row["top1_agreement"] = worst[2 * i], -worst[2 * i + 1]


def bench_model(config: str, layouts, tokens_list, world_size: int, device: str, backends, steps: int,
                dtype: str, layers: int | None = None, check_logits: bool = True, seed: int = 0,
                eager: bool = False, timeout_s: float = 900.0) -> dict:
    """Every (layout, tokens) point in one pool of `world_size` ranks; progress on stderr."""
    from ..layout import Layout
    from ..spmd import SpmdPool

    points = []
    for name in layouts:
        layout = Layout.parse(name)
        if layout.world_size != world_size:
            raise ValueError(f"layout {name} has {layout.world_size} ranks, world_size is {world_size}")
        for tokens in tokens_list:
            counts = tokens_for(layout, tokens)
            if counts is None:
                print(f"[model] skipping tokens {tokens} for {layout.name}: it has {layout.attn_dp} DP groups",
                      file=sys.stderr)
            else:
                points.append((name, layout.moe_tp, counts))
    max_tokens = max(max(counts) for _, _, counts in points)
    results = []
    with SpmdPool(world_size, device) as pool:
        for i, (name, moe_tp, counts) in enumerate(points, 1):
            print(f"[model {i}/{len(points)}] {config} {name} tokens/dp {counts} ...", file=sys.stderr, flush=True)
            results.append(pool.run(run_model_bench, config, layers, name, moe_tp, counts, list(backends), steps,
                                    dtype, check_logits, seed, max_tokens, eager, timeout=timeout_s)[0])
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "device": device, "world_size": world_size, "results": results}


def format_model_table(results: dict) -> str:
    header = (f"{'config':<16} {'layout':<16} {'tokens/dp':>10} {'backend':>11} {'step us':>10} {'speed-up':>9} "
              f"{'tokens/s':>10} {'comm %':>7} {'max rel err':>12} {'top-1':>6}")
    lines = [header, "-" * len(header)]
    for run in results["results"]:
        first = run["backends"][0]["step_us"]
        tokens = ",".join(map(str, run["tokens_per_dp"]))
        for b in run["backends"]:
            share = 100 * b["comm_us"] / b["step_us"]
            lines.append(f"{run['config']:<16} {run['layout']:<16} {tokens:>10} {b['backend']:>11} "
                         f"{b['step_us']:>10.1f} {first / b['step_us']:>8.2f}x {b['tokens_per_s']:>10.1f} "
                         f"{share:>7.1f} {b.get('max_rel_error', float('nan')):>12.3g} "
                         f"{b.get('top1_agreement', float('nan')):>6.3f}")
    return "\n".join(lines)


FP32_TOLERANCE = 1e-5  # relative, against the single-device model


def verdict(results: dict) -> str:
    """One line per dtype: fp32 runs must match to FP32_TOLERANCE with every top-1 equal; 16-bit
    runs are reported (rounding differs between a sharded and a single-device computation)."""
    runs = [(r["dtype"], b) for r in results["results"] for b in r["backends"] if "max_rel_error" in b]
    if not runs:
        return "check: skipped (--no-check)"
    worst = max(b["max_rel_error"] for _, b in runs)
    top1 = min(b["top1_agreement"] for _, b in runs)
    if all(d == "float32" for d, _ in runs):
        ok = worst < FP32_TOLERANCE and top1 == 1.0
        return (f"check against the single-device model: {'PASS' if ok else 'FAIL'} (max relative error "
                f"{worst:.2e}, tolerance {FP32_TOLERANCE:g}; top-1 agreement {top1:.3f})")
    return f"check against the single-device model: max relative error {worst:.3g}, top-1 agreement {top1:.3f}"
