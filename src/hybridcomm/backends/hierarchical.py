"""Hierarchical algorithms for groups that span nodes (topology.py has the vocabulary).

Legs inside a node are the communicator's own ops on the group's node part (`<group>/node`):
our kernels or NCCL as the single-node table picks on GPU, the reference on CPU. Legs across
nodes run on the group's rail (`<group>/rail`) through torch.distributed (NCCL or gloo) and
move raw bytes, so every dtype crosses exactly; the sums across nodes are local fp32 sums in
node order. Each GPU sends only its share over the network: its own rows (gathers), its
node's partial of one member's rows (scatters), 1/L of the message (two-shot all_reduce).

The results are the reference's bit for bit, in the order defined for groups across nodes
(topology.sum_by_node): fp32 per node in group order, rounded to the input dtype (what
crosses the network), then fp32 over nodes in node order, rounded once.

Counts: NCCL needs its message sizes on the host, so rail legs move blocks padded to a
per-member capacity P fixed on the host: max(sizes) for host sizes; for device sizes the
input's rows (a gather's input holds one member's capacity; a scatter's input, which any
one member could receive entirely, is the bound for each member). The legs inside the node
are fixed-size too, and rows are put in group order by an index computed from the counts
with device ops. So a captured graph replays with new device counts; the cost is padding:
with device sizes a gather's rail leg moves (N - 1) * P rows per GPU whatever the counts,
a scatter's moves (N - 1) * (input rows) per GPU. Counts above P raise CapacityExceeded in
eager calls; inside a graph they are clamped (never out of bounds, result incomplete).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist

from .. import subops
from ..arguments import Sizes, parse_sizes, result_rows, split_evenly, split_sizes
from ..errors import CapacityExceeded, PeerTimeout
from ..groups import Group, leg_name
from ..norm import add_rms_norm
from ..topology import sum_by_node, sum_in_order


# -- rail legs (torch.distributed, raw bytes) ----------------------------------------------------
def _raw(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


def rail_all_gather(t: torch.Tensor, rail: Group) -> list[torch.Tensor]:
    """Every rail member's `t` (same shape everywhere), in node order."""
    if t.numel() == 0:
        return [t] * rail.size
    raw = _raw(t)
    out = raw.new_empty((rail.size, raw.numel()))
    dist.all_gather(list(out.unbind(0)), raw, group=rail.pg)
    return [o.view(t.dtype).view(t.shape) for o in out.unbind(0)]


def rail_all_to_all(blocks: torch.Tensor, rail: Group) -> torch.Tensor:
    """blocks[n] goes to the rail member on node position n; returns what each sent to us."""
    if blocks.numel() == 0:
        return blocks
    out = torch.empty_like(_raw(blocks))
    dist.all_to_all_single(out, _raw(blocks), group=rail.pg)
    return out.view(blocks.dtype).view(blocks.shape)


# -- counts and row order ---------------------------------------------------------------------------
def member_capacity(sizes: Sizes, input_rows: int) -> int:
    """P: rows each member's block holds on the rail legs (the same on every rank)."""
    return max(sizes.host, default=0) if sizes.host is not None else input_rows


def block_of_member(count: int, nodes: int, per_node: int, device) -> torch.Tensor:
    """Member m = n * L + j (group order) sits in block j * N + n after a rail-then-node gather."""
    m = torch.arange(count, device=device)
    return (m % per_node) * nodes + m // per_node


def gathered_index(counts: torch.Tensor, nodes: int, per_node: int, cap: int, out_rows: int) -> torch.Tensor:
    """Row r of the result (group order) -> its row in the (j, n)-ordered blocks of `cap` rows."""
    ends = counts.cumsum(0)
    r = torch.arange(out_rows, device=counts.device)
    m = torch.searchsorted(ends, r, right=True).clamp(max=counts.numel() - 1)
    within = (r - (ends[m] - counts[m])).clamp(0, max(cap - 1, 0))
    return block_of_member(counts.numel(), nodes, per_node, counts.device)[m] * cap + within


def scattered_index(counts: torch.Tensor, nodes: int, per_node: int, cap: int, input_rows: int) -> torch.Tensor:
    """Row (b, w) of the (j, n)-ordered blocks -> row w of member m(b)'s slice of the input."""
    starts = counts.cumsum(0) - counts
    b = torch.arange(nodes * per_node, device=counts.device)
    m = (b % nodes) * per_node + b // nodes  # block b = j * N + n holds member n * L + j
    w = torch.arange(cap, device=counts.device)
    return (starts[m][:, None] + w[None, :]).clamp(max=max(input_rows - 1, 0)).reshape(-1)


class HierarchicalBackend:
    """(Quantized gathers never come here: the Communicator keeps them on the flat paths.)"""

    name = "hierarchical"

    def __init__(self, comm):
        self.comm, self.groups, self.timeout_s = comm, comm.groups, comm.timeout_s
        self._indices: dict[tuple, torch.Tensor] = {}

    def _index(self, build, sizes: Sizes, device, *shape: int) -> torch.Tensor:
        """build(counts, *shape) on the device; for host sizes made once per (counts, shape) and
        reused, so a call inside graph capture copies nothing from the host."""
        if sizes.on_device:
            return build(sizes.device.long(), *shape)
        key = (build.__name__, sizes.host) + shape
        if key not in self._indices:
            self._indices[key] = build(torch.tensor(sizes.host, dtype=torch.int64, device=device), *shape)
        return self._indices[key]

    def _run(self, op: str, group: str, x: torch.Tensor, sizes=None) -> torch.Tensor:
        """One op of a leg or sub-step on a (public or internal) group (subops.run)."""
        return subops.run(self.comm, op, group, x, sizes)

    def _gather(self, x: torch.Tensor, sizes: Sizes, group: str) -> torch.Tensor:
        """all_gather_v over a public group. Device sizes: a fixed-size gather of every member's
        whole input, then the valid rows moved to the front (legs in a node may run on NCCL,
        which cannot read counts on the device inside a graph)."""
        if not sizes.on_device:
            return self._run("all_gather_v", group, x, sizes)
        n = sizes.count
        everything = self._run("all_gather_v", group, x, [x.shape[0]] * n)
        return everything.index_select(0, self._index(gathered_index, sizes, x.device, 1, n, x.shape[0],
                                                      n * x.shape[0]))

    # -- legs -----------------------------------------------------------------------------------
    def _legs(self, group: Group) -> tuple[Group, Group]:
        return self.groups[leg_name(group.name, "node")], self.groups[leg_name(group.name, "rail")]

    @contextmanager
    def _leg(self, op: str, group: Group, leg: Group):
        """A leg whose peer does not arrive within the deadline raises PeerTimeout naming the op,
        the public group and the leg's other members (the transport does not say which one)."""
        try:
            yield
        except PeerTimeout:
            raise
        except RuntimeError as e:
            if "timed out" not in str(e).lower() and "timeout" not in str(e).lower():
                raise
            others = tuple(r for r in leg.ranks if r != self.comm.rank)
            raise PeerTimeout(op, group.name, others[0] if len(others) == 1 else others, self.timeout_s) from e

    def _check_capacity(self, op: str, counts: torch.Tensor, cap: int) -> None:
        if self.comm._capturing():
            return
        if counts.numel() and int(counts.max()) > cap:
            raise CapacityExceeded(f"{op}: device-side sizes {counts.tolist()} exceed the {cap} rows per "
                                   f"member that the inputs hold")

    # -- ops ------------------------------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor, group: Group, algorithm: str) -> torch.Tensor:
        node, rail = self._legs(group)
        if algorithm == "one_shot":  # node sums everywhere in the node, then every rank sums its rail's
            with self._leg("all_reduce", group, node):
                partial = self._run("all_reduce", node.name, x)
            with self._leg("all_reduce", group, rail):
                return sum_in_order(rail_all_gather(partial, rail)).to(x.dtype)
        # two-shot: reduce-scatter in the node, all-reduce of 1/L on the rail, all-gather in the node
        width = max(16 // x.element_size(), 1)
        rows = x.view(-1, width) if x.numel() % width == 0 else x.view(-1, 1)
        counts = split_evenly(rows.shape[0], node.size)
        with self._leg("all_reduce", group, node):
            chunk = self._run("reduce_scatter_v", node.name, rows, counts)
        with self._leg("all_reduce", group, rail):
            summed = sum_in_order(rail_all_gather(chunk, rail)).to(x.dtype)
        with self._leg("all_reduce", group, node):
            return self._run("all_gather_v", node.name, summed, counts).view(x.shape)

    def all_gather_v(self, x: torch.Tensor, sizes: Sizes, group: Group, algorithm=None, quant=None) -> torch.Tensor:
        """Rail first (each GPU's own rows cross the network once per other node), then the node."""
        node, rail = self._legs(group)
        cap = member_capacity(sizes, x.shape[0])
        if sizes.on_device:
            self._check_capacity("all_gather_v", sizes.device, cap)
        padded = x.new_zeros((cap,) + tuple(x.shape[1:]))
        padded[: x.shape[0]] = x[:cap]
        with self._leg("all_gather_v", group, rail):
            blocks = torch.cat(rail_all_gather(padded, rail))
        with self._leg("all_gather_v", group, node):
            everything = self._run("all_gather_v", node.name, blocks, [blocks.shape[0]] * node.size)
        out_rows = result_rows(sizes, group.index, x.shape[0], gathered=True)
        return everything.index_select(0, self._index(gathered_index, sizes, x.device, rail.size, node.size, cap,
                                                      out_rows))

    def reduce_scatter_v(self, x: torch.Tensor, sizes: Sizes, group: Group, algorithm=None) -> torch.Tensor:
        """Node first (sum each member's slice over the node), then the rail (each GPU receives
        its slice's node partials and sums them in node order)."""
        node, rail = self._legs(group)
        cap = member_capacity(sizes, x.shape[0])
        if sizes.on_device:
            self._check_capacity("reduce_scatter_v", sizes.device.long().cumsum(0), x.shape[0])
        blocks = x.index_select(0, self._index(scattered_index, sizes, x.device, rail.size, node.size, cap,
                                               x.shape[0]))
        with self._leg("reduce_scatter_v", group, node):
            partials = self._run("reduce_scatter_v", node.name, blocks, [rail.size * cap] * node.size)
        with self._leg("reduce_scatter_v", group, rail):
            received = rail_all_to_all(partials.view((rail.size, cap) + tuple(x.shape[1:])), rail)
        mine = sum_in_order(list(received.unbind(0))).to(x.dtype) if rail.size else received
        return mine[: result_rows(sizes, group.index, x.shape[0], gathered=False)]

    def gather_tokens(self, x, dp_sizes: Sizes, partial: bool, fusion=None, algorithm=None, quant=None):
        """Reduce over attn-TP, then all_gather_v over attn-DP (each hierarchical where its group
        spans nodes). The fused norm needs the fp32 sum: gather the partials, sum them here."""
        tp = self.groups["attn_tp"]
        reduce = partial and tp.size > 1
        if fusion is None:
            reduced = self._run("all_reduce", "attn_tp", x) if reduce else x
            return self._gather(reduced, dp_sizes, "attn_dp")
        if reduce:
            parts = self._run("all_gather_v", "attn_tp", x, [x.shape[0]] * tp.size).view((tp.size,) + tuple(x.shape))
            reduced = sum_by_node(list(parts.unbind(0)), tp.nodes, x.dtype)
        else:
            reduced = x.float()
        normed, residual_out = add_rms_norm(reduced, fusion.residual, fusion.weight, fusion.eps)
        return self._gather(normed, dp_sizes, "attn_dp"), residual_out

    def scatter_tokens(self, y, dp_sizes: Sizes, algorithm=None):
        """reduce_scatter_v over the world (each attn-TP rank gets a chunk of its DP group's
        rows), then all_gather_v of the chunks over attn-TP; with one DP group, all_reduce."""
        tp, dp = self.groups["attn_tp"], self.groups["attn_dp"]
        if tp.size == 1:
            return self._run("reduce_scatter_v", "world", y, dp_sizes)
        if dp.size == 1:  # one DP group: every rank gets every row, summed over the world
            return self._run("all_reduce", "world", y)
        world_sizes = split_sizes(dp_sizes, tp.size)
        chunk = self._run("reduce_scatter_v", "world", y, world_sizes)
        mine = world_sizes[dp.index * tp.size: (dp.index + 1) * tp.size]
        out = self._gather(chunk, parse_sizes(mine, tp.size, y.device, "sizes"), "attn_tp")
        return out[: result_rows(dp_sizes, dp.index, y.shape[0], gathered=False)]
