"""A cost model for ops across nodes: flat NCCL against our hierarchical algorithms.

Every leg costs latency + bytes / bandwidth. Bytes are "bus bytes" per GPU (nccl-tests):
all-reduce 2(n-1)/n of the message, all-gather (n-1)/n of the output, reduce-scatter (n-1)/n
of the input, for a group of n.

Inside a node (from an earlier 4x H200 run, results/model/ops_4xH200_calibration.json, bf16, graph replay):
  latency   = the op's time at 2 KB (hybridcomm column: our kernels; nccl column: NCCL),
  bandwidth = bus bytes / (time - latency), at 4 MB for our kernels (the largest size the
              table gives them for every op) and at 64 MB for NCCL.
  A leg inside a node costs the cheaper of the two (that is what the selection table does),
  or NCCL's when `node_legs="nccl"` (today's GPU path across nodes: the nvlink workspace is
  single-node, see README).
Across nodes (user parameters; defaults: 400 Gb/s InfiniBand per GPU, one NIC per GPU, rails):
  net_gbps GB/s per GPU and direction (default 50 = 400 Gb/s line rate), hop_us per network
  step on a collective's critical path (default 5 µs: RDMA write, NCCL proxy, completion),
  and every NCCL collective pays NCCL's in-node fixed cost (its 2 KB time) on top.
Flat NCCL over n GPUs on N nodes (L per node): ring bandwidth min(NCCL's NVLink bus
  bandwidth, L * net_gbps) (one ring per NIC), N - 1 network hops for all-gather /
  reduce-scatter (ring), 2 * ceil(log2 N) for all-reduce (NCCL's tree for small messages).
Hierarchical (backends/hierarchical.py), rail legs with one GPU per node:
  all_reduce one-shot : node all-reduce (M) + rail all-gather of M per GPU
  all_reduce two-shot : node reduce-scatter (M) + rail all-gather of M/L + node all-gather (M)
  all_gather_v        : rail all-gather of each GPU's rows + node all-gather (output M)
  reduce_scatter_v    : node reduce-scatter (input M) + rail all-to-all of M/n per peer node
The transitions compose these as the backends do (README "Across nodes").
Not modelled: padding of device-side counts (the model takes balanced host counts), the
local sums and index copies, congestion beyond one NIC per GPU, NCCL protocol switches.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from .layout import Layout

OPS = ("all_reduce", "all_gather_v", "reduce_scatter_v")
# The `bench ops --world 4` run the model was calibrated on (the LL kernels of the earlier
# 4xH200 run, kept beside the model's output; re-calibrate when the tables in README change).
RESULTS = Path(__file__).resolve().parents[2] / "results" / "model" / "ops_4xH200_calibration.json"
SMALL, OURS_LARGE, NCCL_LARGE = 2 << 10, 4 << 20, 64 << 20


def bus_bytes(op: str, nbytes: float, n: int) -> float:
    if n <= 1:
        return 0.0
    return nbytes * (2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n)


@dataclass(frozen=True)
class Leg:
    """latency (µs) + bus bytes / bandwidth (GB/s)."""

    latency_us: float
    gbps: float

    def us(self, bus: float) -> float:
        return self.latency_us + bus / (self.gbps * 1e3)


# Derived from RESULTS by `in_node_legs` (a test re-derives them).
OURS_4xH200 = {"all_reduce": Leg(4.233, 189.4), "all_gather_v": Leg(5.890, 156.1),
               "reduce_scatter_v": Leg(6.446, 151.4)}
NCCL_4xH200 = {"all_reduce": Leg(20.900, 318.7), "all_gather_v": Leg(17.301, 269.4),
               "reduce_scatter_v": Leg(19.373, 268.3)}


def in_node_legs(path: Path = RESULTS) -> tuple[dict[str, Leg], dict[str, Leg]]:
    """(our kernels, NCCL) per op from a `bench ops --world 4` result file."""
    records = json.loads(Path(path).read_text())["records"]
    n = json.loads(Path(path).read_text())["world_size"]
    t = {(r["op"], r["impl"], r["bytes"]): r["us"] for r in records}

    def leg(op: str, impl: str, large: int) -> Leg:
        small_us, large_us = t[op, impl, SMALL], t[op, impl, large]
        return Leg(round(small_us, 3), round(bus_bytes(op, large, n) / (large_us - small_us) / 1e3, 1))

    return ({op: leg(op, "hybridcomm", OURS_LARGE) for op in OPS},
            {op: leg(op, "nccl", NCCL_LARGE) for op in OPS})


@dataclass(frozen=True)
class Params:
    net_gbps: float = 50.0  # per GPU and direction: 400 Gb/s InfiniBand
    hop_us: float = 5.0
    ours: dict = field(default_factory=lambda: dict(OURS_4xH200))
    nccl: dict = field(default_factory=lambda: dict(NCCL_4xH200))
    node_legs: str = "best"  # "best" (the table: ours or NCCL) | "nccl"


# -- legs ---------------------------------------------------------------------------------------
def in_node(op: str, nbytes: float, n: int, p: Params) -> float:
    """One op on a group of n GPUs inside a node (message as in bus_bytes)."""
    if n <= 1:
        return 0.0
    nccl = p.nccl[op].us(bus_bytes(op, nbytes, n))
    return nccl if p.node_legs == "nccl" else min(nccl, p.ours[op].us(bus_bytes(op, nbytes, n)))


def rail(per_gpu_bytes: float, nodes: int, hops: int, p: Params, op: str = "all_gather_v") -> float:
    """A NCCL collective on a rail (one GPU per node): each GPU sends per_gpu_bytes to every
    other node."""
    return p.nccl[op].latency_us + hops * p.hop_us + (nodes - 1) * per_gpu_bytes / (p.net_gbps * 1e3)


def flat_nccl(op: str, nbytes: float, n: int, nodes: int, p: Params) -> float:
    """One NCCL collective over n GPUs on `nodes` nodes."""
    if nodes == 1:
        return 0.0 if n <= 1 else p.nccl[op].us(bus_bytes(op, nbytes, n))
    hops = 2 * math.ceil(math.log2(nodes)) if op == "all_reduce" else nodes - 1
    gbps = min(p.nccl[op].gbps, (n // nodes) * p.net_gbps)
    return p.nccl[op].latency_us + hops * p.hop_us + bus_bytes(op, nbytes, n) / (gbps * 1e3)


def hierarchical(op: str, nbytes: float, n: int, nodes: int, p: Params) -> tuple[float, str]:
    """(µs, algorithm) of our path for one op over n GPUs on `nodes` nodes."""
    if nodes == 1:
        return in_node(op, nbytes, n, p), "in node"
    per_node = n // nodes
    if op == "all_reduce":
        one = in_node("all_reduce", nbytes, per_node, p) + rail(nbytes, nodes, nodes - 1, p)
        two = (in_node("reduce_scatter_v", nbytes, per_node, p) + rail(nbytes / per_node, nodes, nodes - 1, p)
               + in_node("all_gather_v", nbytes, per_node, p))
        return min((one, "one_shot"), (two, "two_shot"))
    if op == "all_gather_v":
        return rail(nbytes / n, nodes, nodes - 1, p) + in_node("all_gather_v", nbytes, per_node, p), "rail_first"
    return (in_node("reduce_scatter_v", nbytes, per_node, p)
            + rail(nbytes / n, nodes, 1, p, "reduce_scatter_v"), "rail_first")


# -- groups of a layout and the transitions ---------------------------------------------------------
def group_shape(layout: Layout, name: str) -> tuple[int, int]:
    """(members, nodes spanned) of rank 0's group `name`."""
    ranks = layout.group_ranks(name, 0)
    return len(ranks), len({layout.coords(r).node for r in ranks})


MODES = ("flat", "hier", "best")  # flat NCCL | our hierarchical legs | the cheaper (the table's aim)


def op_us(op: str, nbytes: float, layout: Layout, group: str, p: Params, mode: str) -> float:
    n, nodes = group_shape(layout, group)
    flat = flat_nccl(op, nbytes, n, nodes, p)
    hier = hierarchical(op, nbytes, n, nodes, p)[0]
    return {"flat": flat, "hier": hier, "best": min(flat, hier)}[mode]


def transition_us(op: str, layout: Layout, tokens: int, row_bytes: int, p: Params, mode: str) -> float:
    """gather_tokens / scatter_tokens with `tokens` rows per DP group. flat: the engines' NCCL
    sequence (nccl backend; one all-reduce for pure attention TP); hier: the hierarchical
    backend's composition with hierarchical sub-ops; best: the cheaper of flat and the
    composition with each sub-op at its best."""
    tp, dp = layout.attn_tp, layout.attn_dp
    group_rows, all_rows = tokens * row_bytes, dp * tokens * row_bytes
    if dp == 1:  # pure attention TP: engines and we run one all_reduce over the world
        return op_us("all_reduce", all_rows, layout, "world", p, mode)
    if op == "gather_tokens":
        engines = (op_us("reduce_scatter_v", group_rows, layout, "attn_tp", p, "flat")
                   + op_us("all_gather_v", all_rows, layout, "world", p, "flat"))
        sub = "best" if mode == "best" else "hier"
        ours = (op_us("all_reduce", group_rows, layout, "attn_tp", p, sub)
                + op_us("all_gather_v", all_rows, layout, "attn_dp", p, sub))
    else:
        engines = (op_us("reduce_scatter_v", all_rows, layout, "world", p, "flat")
                   + op_us("all_gather_v", group_rows, layout, "attn_tp", p, "flat"))
        sub = "best" if mode == "best" else "hier"
        ours = (op_us("reduce_scatter_v", all_rows, layout, "world", p, sub)
                + op_us("all_gather_v", group_rows, layout, "attn_tp", p, sub))
    return {"flat": engines, "hier": ours, "best": min(engines, ours)}[mode]


def predict(nodes: int, gpus_per_node: int, layouts: list[str], tokens: list[int], sizes: list[int],
            row_bytes: int = 8192, p: Params = Params()) -> list[dict]:
    """Rows of the model's table: all_reduce over the world per size, transitions per layout."""
    rows = []
    world = Layout(nodes * gpus_per_node, ranks_per_node=gpus_per_node)
    for size in sizes:
        costs = {m: op_us("all_reduce", size, world, "world", p, m) for m in MODES}
        alg = hierarchical("all_reduce", size, world.world_size, nodes, p)[1]
        rows.append(dict(op="all_reduce", layout=f"world {world.world_size}", amount=size, algorithm=alg, **costs))
    for text in layouts:
        layout = replace(Layout.parse(text), ranks_per_node=gpus_per_node)
        for op in ("gather_tokens", "scatter_tokens"):
            for t in tokens:
                costs = {m: transition_us(op, layout, t, row_bytes, p, m) for m in MODES}
                rows.append(dict(op=op, layout=layout.name, amount=t, algorithm="", **costs))
    return rows


def markdown(rows: list[dict], nodes: int, gpus_per_node: int, p: Params) -> str:
    lines = [f"### {nodes} x {gpus_per_node} GPUs: net {p.net_gbps:g} GB/s per GPU, {p.hop_us:g} µs per network "
             f"hop, legs in a node: {p.node_legs}", "",
             "| op | layout | bytes / tokens per DP group | flat NCCL µs | hierarchical µs | best µs | "
             "best / flat |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        amount = _size(r["amount"]) if r["op"] == "all_reduce" else str(r["amount"])
        alg = f" ({r['algorithm']})" if r["algorithm"] else ""
        lines.append(f"| {r['op']} | {r['layout']} | {amount} | {r['flat']:.1f} | {r['hier']:.1f}{alg} | "
                     f"{r['best']:.1f} | {r['flat'] / r['best']:.2f}x |")
    return "\n".join(lines)


def _size(n: int) -> str:
    return f"{n >> 20} M" if n >= 1 << 20 else f"{n >> 10} K"
