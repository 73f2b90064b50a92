"""Layer benchmark: one decode step of the reference MoE decoder, per backend.

Every backend runs the same step on the same data in the same run; the table reports
each one's step time and its speed-up over the first backend, plus the max abs error
and the max relative row error (max over tokens of ||out - ref|| / ||ref||) against the
single-process reference (so a fast but wrong backend cannot hide).

On CUDA one step is captured in a CUDA graph and replayed (eager launches would hide
the communication behind launch overhead); on CPU eager steps are timed. Times are
medians over repeats, then the max over ranks (the slowest rank sets the step time).

Reading the error columns: the model pins each token's top-k expert set with a routing
margin (ModelConfig.route_margin), so rounding differences between the ranks and the
reference cannot flip a token's experts, and the errors measure the arithmetic along
the communication path, not routing tie-breaks (with route_margin=0, bf16 runs on CPU
had a few tokens with flipped experts and relative row errors of 0.2-0.5). fp32 gives
max abs errors ~1e-5. In bf16 the ranks round partial sums where the reference does
not; measured on CPU (gloo, dp2xtp2, 456 tokens, the tiny config and wider/deeper
variants of it) the max relative row error was 1e-2 to 2e-2; not yet measured on GPU.
Max abs error scales with the hidden states' magnitude; the relative error is the one
to compare across configs.
"""

from __future__ import annotations

import datetime
import statistics
import sys
from dataclasses import replace
from typing import Sequence

import torch
import torch.distributed as dist

from ..communicator import Communicator
from ..layout import Layout
from ..model import (Batch, DistributedDecoder, ModelConfig, ModelWeights, dtype_from_name,
                     make_dp_batch, rank_part, reference_forward)
from . import timing

# Display name per backend argument: "auto" is this library's own selection.
LABELS = {"auto": "hybridcomm", "nccl_symm": "nccl-symm"}
REPEATS = 5

# Workers of an SpmdPool live across calls; building the bench model's weights takes
# seconds and every Communicator creates process groups (NCCL communicators on GPU),
# so each worker keeps the latest weights and one Communicator per (layout, backend).
_weights: dict[tuple[ModelConfig, str], ModelWeights] = {}
_communicators: dict[tuple[Layout, str], Communicator] = {}


def _worker_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _model_weights(cfg: ModelConfig, device: torch.device) -> ModelWeights:
    key = (cfg, str(device))
    if key not in _weights:
        _weights.clear()  # one model at a time: the bench model is gigabytes
        _weights[key] = ModelWeights.generate(cfg, device)
    return _weights[key]


def _communicator(layout: Layout, backend: str, device: torch.device) -> Communicator:
    key = (layout, backend)
    if key not in _communicators:
        _communicators[key] = Communicator(layout, device=device, backend=backend)
    return _communicators[key]


def parse_layout(layout_name: str, moe_tp: int | None = None) -> Layout:
    """'dp2xtp2' (optionally ',moe_tp2'); `moe_tp`, when given, overrides the name's."""
    layout = Layout.parse(layout_name)
    return layout if moe_tp is None else replace(layout, moe_tp=moe_tp)


def _errors(out: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    """(max abs error, max over rows of ||out_row - ref_row|| / max(||ref_row||, tiny))."""
    if out.shape != expected.shape:
        return float("inf"), float("inf")
    if out.numel() == 0:
        return 0.0, 0.0
    diff, ref = out.float() - expected.float(), expected.float()
    rel = diff.norm(dim=-1) / ref.norm(dim=-1).clamp_min(torch.finfo(torch.float32).tiny)
    return diff.abs().max().item(), rel.max().item()


# -- one (layout, tokens) point, on every rank ---------------------------------------------
def run_layer_bench(layout_name: str, moe_tp: int | None, tokens_per_dp: list[int],
                    backends: list[str], steps: int, warmup: int, dtype_name: str,
                    config_name: str, use_graphs: bool, quant: str | None = None) -> dict:
    """Run on every rank of an SpmdPool. Returns the same dict on every rank:
    {layout, world_size, tokens_per_dp, config, dtype, quant, graphs, steps,
     backends: [{backend, step_us, max_abs_error, max_rel_error}, ...]} with step_us the
    median step time, max_abs_error the largest element error against `reference_forward`
    and max_rel_error the largest relative row error ||out - ref|| / ||ref||, all max
    over ranks. quant: a hybridcomm.quant format for the gather into the MoE (fp8: fp8
    experts; see model/quantized.py), None for 16-bit; the reference stays unquantized."""
    layout = parse_layout(layout_name, moe_tp)
    if len(tokens_per_dp) != layout.attn_dp:
        raise ValueError(f"tokens_per_dp: layout {layout.name} has {layout.attn_dp} DP groups, "
                         f"got {len(tokens_per_dp)} counts: {tokens_per_dp}")
    device = _worker_device()
    if use_graphs and device.type != "cuda":
        raise ValueError("use_graphs: CUDA graphs need a CUDA pool")
    cfg = ModelConfig.named(config_name, dtype_from_name(dtype_name))
    cfg.check_layout(layout)
    weights = _model_weights(cfg, device)
    rank = dist.get_rank()
    dp = layout.coords(rank).attn_dp_rank
    group = make_dp_batch(cfg, tokens_per_dp[dp], dp, device)
    # Requests never interact, so the reference of this DP group alone gives its rows;
    # building every group on every rank would multiply the (large) KV caches.
    expected = reference_forward(cfg, weights, Batch([group]))[0]
    part = rank_part(group, cfg, layout, rank)
    del group
    rows = []
    for backend in backends:
        decoder = DistributedDecoder(cfg, weights, _communicator(layout, backend, device), quant=quant)
        step = lambda: decoder.forward(part, tokens_per_dp)  # noqa: E731
        if use_graphs:
            times, out = timing.graph_times(step, replays=steps, repeats=REPEATS, warmup=warmup)
        else:
            times, out = timing.eager_times(step, steps, warmup)
        step_us, abs_error, rel_error = timing.max_over_ranks([statistics.median(times), *_errors(out, expected)])
        rows.append({"backend": LABELS.get(backend, backend), "step_us": step_us,
                     "max_abs_error": abs_error, "max_rel_error": rel_error})
        del decoder, out
    return {"layout": layout.name, "world_size": layout.world_size, "tokens_per_dp": list(tokens_per_dp),
            "config": config_name, "dtype": dtype_name, "quant": quant, "graphs": bool(use_graphs),
            "steps": steps, "backends": rows}


def describe_device() -> str:
    if dist.get_backend() == "nccl":
        return torch.cuda.get_device_name()
    return "cpu"


# -- the driver ---------------------------------------------------------------------------
def tokens_for(layout: Layout, tokens) -> list[int] | None:
    """An int means that many tokens on every DP group; a list gives one count per group
    (None when its length is not this layout's number of DP groups)."""
    if isinstance(tokens, int):
        return [tokens] * layout.attn_dp
    tokens = [int(t) for t in tokens]
    return tokens if len(tokens) == layout.attn_dp else None


def _points(layouts: Sequence[str], tokens_list: Sequence, world_size: int,
            cfg: ModelConfig) -> list[tuple[Layout, list[int]]]:
    points = []
    for name in layouts:
        layout = Layout.parse(name)
        if layout.world_size != world_size:
            raise ValueError(f"layout {name} has {layout.world_size} ranks, world_size is {world_size}")
        cfg.check_layout(layout)
        for tokens in tokens_list:
            counts = tokens_for(layout, tokens)
            if counts is None:
                print(f"[layer] skipping tokens {list(tokens)} for {layout.name}: it has "
                      f"{layout.attn_dp} DP groups", file=sys.stderr)
            else:
                points.append((layout, counts))
    if not points:
        raise ValueError(f"no (layout, tokens) pair fits: layouts {list(layouts)}, tokens {list(tokens_list)}")
    return points


def bench_layer(layouts: Sequence[str], tokens_list: Sequence, world_size: int, device: str = "cuda",
                backends: Sequence[str] = ("nccl", "auto"), steps: int = 50, warmup: int = 5,
                dtype: str = "bfloat16", config: str = "bench", use_graphs: bool | None = None,
                pool=None, timeout_s: float = 600.0, quants: Sequence[str | None] = (None,)) -> dict:
    """Time one decode step of the reference decoder for every (layout, tokens) pair.

    layouts: names as on the command line ('dp4', 'dp2xtp2', 'tp4', 'dp2xtp2,moe_tp2'),
        each of `world_size` ranks.
    tokens_list: entries are an int (that many tokens on every DP group) or a list with
        one count per DP group (uneven, e.g. [64, 1] for dp2); a list is run only for
        the layouts with that many DP groups (skipped, with a note, for the others).
    device: 'cuda' (one GPU per rank, NCCL) or 'cpu' (gloo; only 'reference' backend).
    backends: Communicator backend names; speed-ups are against the first. 'auto' is
        reported as 'hybridcomm'.
    steps / warmup: timed and untimed steps (per repeat with graphs; REPEATS repeats).
    dtype: 'bfloat16', 'float16' or 'float32'; config: 'bench' or 'tiny' (ModelConfig).
    use_graphs: default True on CUDA, False on CPU.
    pool: an existing SpmdPool of world_size ranks on `device` to reuse; default: one is
        created for this call and closed at the end.
    timeout_s: deadline of each (layout, tokens) point.
    quants: each point runs once per entry: None (16-bit gather and experts) or a
        hybridcomm.quant format (the gather quantizes; fp8 runs fp8 experts).

    Returns a JSON-serialisable dict: {date, torch, device, world_size, config (the
    ModelConfig as a dict), steps, warmup, graphs, results: [one run_layer_bench dict
    per point]}. Print it with `format_layer_table`. Progress goes to stderr.
    """
    from ..spmd import SpmdPool

    graphs = device == "cuda" if use_graphs is None else bool(use_graphs)
    cfg = ModelConfig.named(config, dtype_from_name(dtype))
    points = _points(layouts, tokens_list, world_size, cfg)
    own_pool = pool is None
    if own_pool:
        pool = SpmdPool(world_size, device)
    try:
        results = []
        device_name = pool.run(describe_device, timeout=timeout_s)[0]
        runs = [(layout, tokens, quant) for layout, tokens in points for quant in quants]
        for i, (layout, tokens, quant) in enumerate(runs, 1):
            print(f"[layer {i}/{len(runs)}] {layout.name} tokens/dp {tokens} quant {quant} ...", file=sys.stderr,
                  flush=True)
            results.append(pool.run(run_layer_bench, layout.name, layout.moe_tp, tokens, list(backends),
                                    steps, warmup, dtype, config, graphs, quant, timeout=timeout_s)[0])
    finally:
        if own_pool:
            pool.close()
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "device": device_name, "world_size": world_size,
            "config": {"name": config, **cfg.to_json()}, "steps": steps, "warmup": warmup,
            "graphs": graphs, "results": results}


def format_layer_table(results) -> str:
    """A plain text table (nccl-tests style) of `bench_layer`'s dict, or of a list of
    `run_layer_bench` dicts."""
    runs = results["results"] if isinstance(results, dict) else results
    # A speed-up needs a second backend in the run; a quant column, a quantized run.
    speedups = any(len(run["backends"]) > 1 for run in runs)
    quants = any(run.get("quant") for run in runs)
    header = (f"{'layout':<18} {'tokens/dp':>12} " + (f"{'quant':>7} " if quants else "")
              + f"{'backend':>12} {'step us':>10} "
              + (f"{'speed-up':>9} " if speedups else "") + f"{'max abs err':>12} {'max rel err':>12}")
    lines = [header, "-" * len(header)]
    for run in runs:
        first = run["backends"][0]["step_us"] if run["backends"] else None
        tokens = ",".join(str(t) for t in run["tokens_per_dp"])
        for b in run["backends"]:
            speedup = first / b["step_us"] if first and b["step_us"] else float("nan")
            quant = f"{run.get('quant') or 'none':>7} " if quants else ""
            lines.append(f"{run['layout']:<18} {tokens:>12} {quant}{b['backend']:>12} {b['step_us']:>10.1f} "
                         + (f"{speedup:>8.2f}x " if speedups else "")
                         + f"{b['max_abs_error']:>12.3g} {b.get('max_rel_error', float('nan')):>12.3g}")
    return "\n".join(lines)
