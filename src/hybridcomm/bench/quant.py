"""`hybridcomm bench quant`: quantized gather_tokens against, in the same run, our bf16
gather and the engines' quantize-then-NCCL paths; hidden 4096 and 7168, 1-1024 tokens per
DP rank, balanced and imbalanced.

Columns (µs per call, graph replay, median, max over ranks):
  hc_bf16      our bf16 gather_tokens (the Communicator's choice; the unquantized transition)
  hc_quant     our quantized gather kernel on LL packets (csrc/quant_gather.cu), forced at every size
  hc_quant_lamport  the same on the Lamport protocol (csrc/lamport_quant_gather.cu), forced
  hc_quant_one_hop  the LL kernel with every attention-TP rank summing and quantizing its DP
               group's rows (csrc/quant_rows.cuh "replicated"), forced; only with attn_tp > 1
               (else it is hc_quant's path)
  hc_quant_local    the unquantized Lamport one-shot gather, every rank quantizing the rows it
               sums (csrc/lamport_quant_local.cu), forced; only with attn_tp > 1
  hybridcomm   gather_tokens(..., quant=) as the Communicator chooses
  nccl_q       what engines run: RS(attn-TP, when TP > 1) + quantize (torch reference
               quantizer) + NCCL all-gather of the data + NCCL all-gather of the scales
  nccl_symm_q  the same on NCCL symmetric-window buffers (quantized bytes copied into them)
  nccl_ag_only the two all-gathers alone, symmetric buffers: a lower bound for any
               quantize-then-NCCL path (free quantization)

--counts: how our calls (hc_*, hybridcomm) get the counts, as an engine may hold them
(COUNTS); the NCCL paths always take them on the host, as they must.
  host    every DP group's count, a list (the default)
  device  every DP group's count, an int32 device tensor: what a captured graph replays
  own     hc.Counts of this DP group's count, a device tensor, exchanged inside our kernels
In device and own modes every rank's input holds the case's largest count of rows (its
capacity; the results have dp x capacity rows), of which its own count are read.
"""

from __future__ import annotations

import sys
import time
from typing import Callable

import torch
import torch.distributed as dist

from ..arguments import split_evenly
from ..backends.nccl import all_gather_rows, reduce_scatter_rows
from ..communicator import Communicator
from ..counts import Counts
from ..layout import Layout
from ..quant import FORMATS, parse_quant, quantize
from . import shared, timing
from .baselines import SHARED_GPU, NcclSymmetricBuffers
from .ops import add_forced_calls, forced_communicators
from .quant_floor import floor_markdown
from .transitions import token_cases

HIDDENS = (4096, 7168)
TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
DTYPE = torch.bfloat16
BUFFERS = 5  # input, reduced chunk, gathered data, gathered scales, quantized bytes to send
GLOBAL_SCALE = 448.0 * 6.0 / 5.0  # nvfp4: randn rows have amax about 5
# The quantize-then-NCCL paths take >= 25 us a call (results/4xH200/quant_4xH200.md) and dozens
# of kernels each (the torch quantizer): 20 calls make a replay of >= 0.5 ms, long enough to
# time, and keep their graph captures from dominating the sweep's run time.
NCCL_CALLS_PER_GRAPH = 20
COUNTS = ("host", "device", "own")  # --counts (module docstring)


def _cut(buffer: torch.Tensor, offset: int, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """A (rows, cols) tensor of `dtype` at byte `offset` of a flat byte buffer."""
    return buffer[offset: offset + shape[0] * shape[1] * dtype.itemsize].view(dtype).view(shape)


class QuantThenGather:
    """The engines' path on given flat byte buffers: reduce over attn-TP, quantize into the
    send buffer, all-gather the data and then the scales over the world."""

    def __init__(self, comm: Communicator, buffers: list[torch.Tensor], fmt: str, hidden: int, global_scale):
        self.comm, self.buffers, self.fmt, self.hidden, self.g = comm, buffers, fmt, hidden, global_scale
        spec = FORMATS[fmt]
        self.data_cols = spec.data_cols(hidden)
        self.scale_bytes = spec.row_bytes(hidden) - self.data_cols

    def input(self, rows: int) -> torch.Tensor:
        return _cut(self.buffers[0], 0, (rows, self.hidden), DTYPE)

    def gather(self, x, counts, quantize_rows: bool = True):
        groups, tp, b = self.comm.groups, self.comm.layout.attn_tp, self.buffers
        chunks = split_evenly(counts[groups["attn_dp"].index], tp)
        chunk = x
        if tp > 1:
            chunk = reduce_scatter_rows(x, chunks, groups["attn_tp"],
                                        out=_cut(b[1], 0, (chunks[groups["attn_tp"].index], self.hidden), DTYPE))
        rows = chunk.shape[0]
        send_data = _cut(b[4], 0, (rows, self.data_cols), torch.uint8)
        send_scales = _cut(b[4], -(-rows * self.data_cols // 256) * 256, (rows, self.scale_bytes), torch.uint8)
        if quantize_rows:
            q = quantize(chunk, self.fmt, self.g)
            send_data.copy_(q.data.view(torch.uint8))
            send_scales.copy_(q.scales.view(torch.uint8))
        world_counts = [c for n in counts for c in split_evenly(n, tp)]
        total = sum(world_counts)
        data = all_gather_rows(send_data, world_counts, groups["world"], out=_cut(b[2], 0, (total, self.data_cols), torch.uint8))
        scales = all_gather_rows(send_scales, world_counts, groups["world"],
                                 out=_cut(b[3], 0, (total, self.scale_bytes), torch.uint8))
        return data, scales


def _our_counts(counts: list[int], mode: str, mine: int, device: torch.device) -> Callable[[], object]:
    """The counts our calls take in `mode` (COUNTS), made anew for every call (a Counts is
    exchanged once: one per step), from tensors made once (a graph replays those)."""
    if mode == "host":
        return lambda: counts
    sizes = torch.tensor(counts if mode == "device" else [mine], dtype=torch.int32, device=device)
    return (lambda: sizes) if mode == "device" else (lambda: Counts(sizes))


def _calls(comm: Communicator, forced_comms: dict, counts: list[int], hidden: int, fmt: str,
           symm: NcclSymmetricBuffers, plain: list[torch.Tensor], counts_mode: str = "host") -> dict:
    groups, device = comm.groups, comm.device
    mine = counts[groups["attn_dp"].index]
    g = GLOBAL_SCALE if FORMATS[fmt].needs_global_scale else None
    spec = parse_quant(fmt, g, None, device)
    engines = QuantThenGather(comm, plain, fmt, hidden, spec.global_scale)
    capacity = engines.input(max(counts)).normal_()
    x = capacity[:mine]
    ours = _our_counts(counts, counts_mode, mine, device)
    xo = x if counts_mode == "host" else capacity  # our calls' input (device, own counts: the capacity)
    calls = {"hc_bf16": lambda: comm.gather_tokens(xo, ours()),
             "hybridcomm": lambda: comm.gather_tokens(xo, ours(), quant=fmt, global_scale=spec.global_scale),
             "nccl_q": lambda: engines.gather(x, counts)}
    # Where a DP group has one rank, one hop and local run the owner path (quant): not timed twice.
    timed = forced_comms if comm.layout.attn_tp > 1 else {
        k: f for k, f in forced_comms.items() if k not in ("hc_quant_one_hop", "hc_quant_local")}
    add_forced_calls(calls, "gather_tokens_quant", timed,
                     lambda c: c.gather_tokens(xo, ours(), quant=fmt, global_scale=spec.global_scale))
    if symm.buffers is not None:
        symm_path = QuantThenGather(comm, symm.buffers, fmt, hidden, spec.global_scale)
        xs = symm_path.input(mine).normal_()
        calls["nccl_symm_q"] = lambda: symm_path.gather(xs, counts)
        calls["nccl_ag_only"] = lambda: symm_path.gather(xs, counts, quantize_rows=False)
    return calls


# Kept by each worker between the sweep's pieces (bench_quant runs one (layout, hidden) per pool
# call): creating buffers and Communicators is collective and slow.
_kept: dict = {}


def _buffers(nbytes: int, device: torch.device, share_gpus: bool):
    if _kept.get("nbytes") != nbytes:
        symm = (NcclSymmetricBuffers.absent(SHARED_GPU) if share_gpus
                else NcclSymmetricBuffers([nbytes] * BUFFERS, device))
        _kept.update(nbytes=nbytes, symm=symm,
                     plain=[torch.empty(nbytes, dtype=torch.uint8, device=device) for _ in range(BUFFERS)])
    return _kept["symm"], _kept["plain"]


def _communicators(layout: Layout, area: int, share_gpus: bool):
    key = ("comms", layout, area, share_gpus)
    own = {"workspace_bytes": area, **({"max_sms": shared.sm_share(layout.world_size)} if share_gpus else {})}
    if key not in _kept:
        _kept[key] = (Communicator(layout, **own), forced_communicators(layout, ["gather_tokens_quant"], **own))
    return _kept[key]


def _calls_per_graph(impl: str, counts: list[int], hidden: int) -> int:
    n = timing.calls_per_graph(sum(counts) * hidden * DTYPE.itemsize)
    return min(n, NCCL_CALLS_PER_GRAPH) if impl.startswith("nccl") else n


def capacity_tokens(layout_names: list[str], tokens: list[int]) -> int:
    """The most tokens a DP rank has in any case of the sweep: the imbalanced case's one busy rank
    (transitions.IMBALANCED) included, which may exceed every balanced count asked for."""
    return max(max(counts) for name in layout_names for _, counts in token_cases(Layout.parse(name), tokens))


def sweep_quant(layout_names: list[str], formats: list[str], hiddens: list[int], tokens: list[int],
                capacity: tuple[int, int] | None = None, share_gpus: bool = False, counts_mode: str = "host") -> dict:
    """Worker entry (every rank). capacity: (tokens, hidden) to size the buffers and workspaces
    for (default: this call's largest), the same for every piece of a sweep so they are kept.
    share_gpus: ranks share a GPU (bench/shared.py): our forced algorithms only. counts_mode:
    one of COUNTS; a record names it where it is not "host" (so host runs pair with older ones)."""
    records = []
    device = torch.device("cuda", torch.cuda.current_device())
    max_tokens, max_hidden = capacity or (capacity_tokens(layout_names, tokens), max(hiddens))
    symm, plain = _buffers(max_tokens * dist.get_world_size() * max_hidden * DTYPE.itemsize, device, share_gpus)
    area = 2 * max_tokens * max_hidden * DTYPE.itemsize + (1 << 20)  # LL: 2x the largest bf16 rows
    for name in layout_names:
        layout = Layout.parse(name)
        comm, forced_comms = _communicators(layout, area, share_gpus)
        for hidden in hiddens:
            for label, counts in token_cases(layout, tokens):
                for fmt in formats:
                    calls = _calls(comm, forced_comms, counts, hidden, fmt, symm, plain, counts_mode)
                    # The bytes floor (quant_floor.py) reads hybridcomm and hc_bf16: kept where the table
                    # picks our kernels for them (shared.on_nvlink).
                    if share_gpus:
                        calls = shared.ours_only(calls, forced_comms,
                                                 also=shared.on_nvlink(calls, comm, ("hc_bf16", "hybridcomm")))
                    names = sorted(calls)
                    us = timing.max_over_ranks([timing.graph_us(calls[k], _calls_per_graph(k, counts, hidden))
                                                for k in names])
                    for k, t in zip(names, us):
                        records.append({"layout": layout.name, "format": fmt, "hidden": hidden, "case": label,
                                        "tokens_per_dp": counts, "impl": k, "us": t,
                                        **({} if counts_mode == "host" else {"counts": counts_mode})})
                    if dist.get_rank() == 0:
                        row = "  ".join(f"{k} {t:.1f}" for k, t in zip(names, us))
                        print(f"[quant] {layout.name} {fmt} h{hidden} {label} {counts}: {row}", file=sys.stderr,
                              flush=True)
    results = {"environment": timing.environment(), "dtype": str(DTYPE), "nccl_symm_note": symm.error,
               "records": records}
    if share_gpus:
        results["shared_gpu"] = shared.description(dist.get_world_size())
    return results


def bench_quant(layouts: list[str], formats: list[str], hiddens: list[int], tokens: list[int],
                world_size: int = 4, timeout_s: float = 900.0, progress: Callable[[dict], None] | None = None,
                share_gpus: bool = False, counts_mode: str = "host") -> dict:
    """The sweep, one pool call (deadline timeout_s) per (layout, hidden); after each,
    progress(the results so far) -- the CLI writes them, so a run cut short keeps its pieces.
    share_gpus: ranks share GPUs, our kernels only (bench/shared.py). counts_mode: COUNTS."""
    from ..spmd import SpmdPool

    results: dict = {}
    with SpmdPool(world_size, "cuda", share_gpus=share_gpus) as pool:
        for layout in layouts:
            for hidden in hiddens:
                start = time.monotonic()
                piece = pool.run(sweep_quant, [layout], formats, [hidden], tokens,
                                 (capacity_tokens(layouts, tokens), max(hiddens)), share_gpus, counts_mode,
                                 timeout=timeout_s)[0]
                results = {**piece, "records": results.get("records", []) + piece["records"]}
                print(f"[quant] {layout} hidden {hidden}: {time.monotonic() - start:.0f} s", file=sys.stderr,
                      flush=True)
                if progress is not None:
                    progress(results)
    return results


# -- report -------------------------------------------------------------------------------------
BASELINES = ("nccl_q", "nccl_symm_q")
# impl -> its ratio column's label: the impl's time / hc_bf16's.
RATIOS = {"hybridcomm": "q/bf16", "hc_quant": "LL/bf16", "hc_quant_one_hop": "1hop/bf16",
          "hc_quant_lamport": "Lamport/bf16", "hc_quant_local": "local/bf16"}


def quant_markdown(results: dict) -> str:
    from collections import defaultdict

    from .report import _fmt, _header, _table

    by: dict = defaultdict(dict)
    for r in results["records"]:
        by[(r["layout"], r["hidden"], r["format"], r["case"], tuple(r["tokens_per_dp"]))][r["impl"]] = r["us"]
    impls = sorted({r["impl"] for r in results["records"]})
    ratio_impls = [i for i in RATIOS if i in impls]
    modes = sorted({r.get("counts", "host") for r in results["records"]})
    out = [f"# bench quant, {results['dtype']} input, our calls' counts: {', '.join(modes)}", "",
           _header(results["environment"]), "",
           "µs per call (CUDA graph replay, median, max over ranks). q/bf16 = hybridcomm / hc_bf16 (< 1: the "
           "quantized gather is faster); " + ", ".join(f"{RATIOS[i]}: {i}" for i in ratio_impls if i != "hybridcomm")
           + " the same; vs NCCL = best quantize-then-NCCL baseline / hybridcomm.", ""]
    for layout, hidden, fmt in dict.fromkeys(k[:3] for k in by):
        rows = []
        for key, cols in by.items():
            if key[:3] != (layout, hidden, fmt):
                continue
            base = [cols[b] for b in BASELINES if b in cols]
            ours = cols.get("hybridcomm")
            ratios = [f"{cols[i] / cols['hc_bf16']:.2f}" if cols.get(i) and cols.get("hc_bf16") else "-"
                      for i in ratio_impls]
            vs = f"{min(base) / ours:.2f}x" if base and ours else "-"
            rows.append([key[3], ",".join(map(str, key[4]))] + [_fmt(cols.get(i)) for i in impls] + ratios + [vs])
        out += [f"## {layout}, hidden {hidden}, {fmt}", "",
                _table(["case", "tokens/DP rank"] + impls + [RATIOS[i] for i in ratio_impls] + ["vs NCCL"], rows),
                ""]
    floor = floor_markdown(results)
    if floor:
        out += [floor]
    for note in ("nccl_symm_note", "shared_gpu"):
        if results.get(note):
            out += [f"{note}: {results[note]}"]
    return "\n".join(out) + "\n"


def quant_plot(results: dict, path) -> str | None:
    from collections import defaultdict

    from .report import _log_plot

    panels: dict = defaultdict(lambda: defaultdict(list))
    for r in results["records"]:
        if r["case"] == "balanced":
            panels[f"{r['layout']} h{r['hidden']} {r['format']}"][r["impl"]].append((r["tokens_per_dp"][0], r["us"]))
    return _log_plot(panels, "tokens per DP rank (balanced)", results["environment"], path)
