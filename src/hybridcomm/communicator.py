"""The Communicator: validates a call, picks a backend and algorithm, runs it.

API and semantics are a contract (DESIGN.md section 3); see README.md for examples.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from . import algorithms
from .arguments import Sizes, check_rows, check_tensor, parse_sizes, result_rows
from .backends.hierarchical import HierarchicalBackend
from .backends.reference import ReferenceBackend
from .groups import Group, create_groups
from .layout import GROUP_NAMES, Layout
from .norm import ResidualNorm

BACKENDS = ("auto", "reference", "nccl", "nvlink")


def resolve_device(device) -> torch.device:
    if device is None:
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device: expected a CPU or CUDA device, got {device}")
    return device


class Communicator:
    """Collectives and token transitions for one rank of a `Layout`.

    Construct on every rank after `torch.distributed.init_process_group`, in the same
    order as other collective setup (it creates process groups, which is collective).

    validate: cross-check sizes (and argument errors) across ranks on every call, so a
        mismatch raises on every rank instead of hanging. Costs one small collective.
    timeout_s: deadline of every wait inside our kernels (PeerTimeout on expiry).
    backend: "auto" (CPU: reference; CUDA: the selection table), or force one of
        "reference", "nccl", "nvlink" (nvlink still falls back to NCCL where it cannot run).
    workspace_bytes: per peer and buffer of the nvlink workspace (see `hybridcomm info`).
    table: the selection table (default algorithms.TABLE); tests and tuning pass others. A
        table keyed by node count (algorithms.TABLES) also sets the tables across nodes.
    """

    def __init__(self, layout: Layout, device=None, *, validate: bool = False,
                 timeout_s: float = 10.0, backend: str = "auto",
                 workspace_bytes: int | None = None, table: dict | None = None):
        if not isinstance(layout, Layout):
            raise TypeError(f"layout: expected a hybridcomm.Layout, got {type(layout).__name__}")
        if not dist.is_initialized():
            raise RuntimeError("Communicator: initialise torch.distributed first "
                               "(torch.distributed.init_process_group)")
        if dist.get_world_size() != layout.world_size:
            raise ValueError(f"layout: world_size={layout.world_size} but torch.distributed has "
                             f"{dist.get_world_size()} ranks")
        if backend not in BACKENDS:
            raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s: expected a positive number of seconds, got {timeout_s!r}")
        self.layout = layout
        self.rank = dist.get_rank()
        self.device = resolve_device(device)
        self.validate = bool(validate)
        self.timeout_s = float(timeout_s)
        self.groups = create_groups(layout, self.rank, self.timeout_s)
        self.backends = {"reference": ReferenceBackend(self.groups), "hierarchical": HierarchicalBackend(self)}
        self.forced = None if backend == "auto" else backend
        self.tables = algorithms.node_tables(table)
        self.table = self.tables[1]
        if self.device.type == "cuda":
            from .backends.nccl import NcclBackend
            self.backends["nccl"] = NcclBackend(self.groups)
            if backend in ("auto", "nvlink"):
                from .backends.nvlink import NvlinkBackend
                self.backends["nvlink"] = NvlinkBackend(self, workspace_bytes)
        elif backend in ("nccl", "nvlink"):
            raise ValueError(f"backend={backend!r} needs a CUDA device, got {self.device}")

    # -- ops ------------------------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor, group: str = "world") -> torch.Tensor:
        """Sum over `group`; returns a new tensor."""
        g = self._group(group)
        self._check("all_reduce", g, lambda: check_tensor(x, "x", self.device))
        nbytes = x.numel() * x.element_size()
        backend, algorithm = self._select("all_reduce", g, nbytes, x)
        return backend.all_reduce(x, g, algorithm)

    def all_gather_v(self, x: torch.Tensor, sizes, group: str = "world") -> torch.Tensor:
        """x holds sizes[i_me] rows; returns sum(sizes) rows in group order."""
        g = self._group(group)

        def check():
            check_tensor(x, "x", self.device)
            s = parse_sizes(sizes, g.size, self.device, "sizes")
            if s.host is not None:
                check_rows(x, "x", s.host[g.index], f"sizes[{g.index}] of this rank")
            return s

        s = self._check("all_gather_v", g, check)
        backend, algorithm = self._select("all_gather_v", g, self._gathered_bytes(x, s, g.index), x, s)
        return backend.all_gather_v(x, s, g, algorithm)

    def reduce_scatter_v(self, x: torch.Tensor, sizes, group: str = "world") -> torch.Tensor:
        """x holds sum(sizes) rows (partial); returns this rank's sizes[i_me] rows, summed."""
        g = self._group(group)

        def check():
            check_tensor(x, "x", self.device)
            s = parse_sizes(sizes, g.size, self.device, "sizes")
            if s.host is not None:
                check_rows(x, "x", sum(s.host), "sum(sizes)")
            return s

        s = self._check("reduce_scatter_v", g, check)
        backend, algorithm = self._select("reduce_scatter_v", g, x.numel() * x.element_size(), x, s)
        return backend.reduce_scatter_v(x, s, g, algorithm)

    def gather_tokens(self, x: torch.Tensor, dp_sizes, partial: bool = True, *,
                      residual: torch.Tensor | None = None,
                      norm_weight: torch.Tensor | None = None, eps: float = 1e-6):
        """Attention output -> MoE input: every rank gets all sum(dp_sizes) rows, reduced
        over attn-TP (when `partial`), in DP-group order.

        With `residual` and `norm_weight`: returns (normed, residual_out), where
        residual_out = reduced + residual (this DP group's rows) and normed = the gathered
        RMSNorm(residual_out) * norm_weight, computed in fp32.
        """
        world, dp = self.groups["world"], self.groups["attn_dp"]
        fusion = None

        def check():
            nonlocal fusion
            check_tensor(x, "x", self.device)
            s = parse_sizes(dp_sizes, self.layout.attn_dp, self.device, "dp_sizes")
            if s.host is not None:
                check_rows(x, "x", s.host[dp.index], f"dp_sizes[{dp.index}] of this DP group")
            if (residual is None) != (norm_weight is None):
                raise ValueError("gather_tokens: pass both residual and norm_weight, or neither")
            if residual is not None:
                fusion = self._check_fusion(x, residual, norm_weight, eps)
            return s

        s = self._check("gather_tokens", world, check)
        op = "gather_tokens" if fusion is None else "gather_tokens_norm"
        backend, algorithm = self._select(op, world,
                                          self._gathered_bytes(x, s, dp.index), x, s)
        return backend.gather_tokens(x, s, bool(partial), fusion, algorithm)

    def scatter_tokens(self, y: torch.Tensor, dp_sizes) -> torch.Tensor:
        """MoE output (partial over the world, all rows) -> this DP group's rows, reduced,
        identical on its attn-TP ranks."""
        world = self.groups["world"]

        def check():
            check_tensor(y, "y", self.device)
            s = parse_sizes(dp_sizes, self.layout.attn_dp, self.device, "dp_sizes")
            if s.host is not None:
                check_rows(y, "y", sum(s.host), "sum(dp_sizes)")
            return s

        s = self._check("scatter_tokens", world, check)
        backend, algorithm = self._select("scatter_tokens", world, y.numel() * y.element_size(), y, s)
        return backend.scatter_tokens(y, s, algorithm)

    def check_errors(self) -> None:
        """Wait for this rank's queued kernels, then raise PeerTimeout (or another error)
        if one of them recorded a failure."""
        nvlink = self.backends.get("nvlink")
        if nvlink is not None:
            torch.cuda.synchronize(self.device)
            nvlink.raise_recorded_error()

    # -- helpers ----------------------------------------------------------------------------
    def _group(self, name: str) -> Group:
        if name not in self.groups:  # also takes the internal "<group>/node" and "<group>/rail"
            raise ValueError(f"group: unknown group name {name!r}; valid names are {list(GROUP_NAMES)}")
        return self.groups[name]

    @staticmethod
    def _gathered_bytes(x: torch.Tensor, sizes: Sizes, index: int) -> int:
        """Size of a gather's result (its capacity when sizes live on the device)."""
        row_bytes = math.prod(x.shape[1:]) * x.element_size()
        return result_rows(sizes, index, x.shape[0], gathered=True) * row_bytes

    def _check_fusion(self, x, residual, weight, eps) -> ResidualNorm:
        check_tensor(residual, "residual", self.device)
        check_tensor(weight, "norm_weight", self.device)
        if x.dim() != 2:
            raise ValueError(f"x: the residual+norm fusion needs 2-d rows x hidden, got shape {tuple(x.shape)}")
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValueError(f"residual: expected shape {tuple(x.shape)} and dtype {x.dtype}, got "
                             f"{tuple(residual.shape)} and {residual.dtype}")
        if weight.shape != (x.shape[1],) or weight.dtype != x.dtype:
            raise ValueError(f"norm_weight: expected shape ({x.shape[1]},) and dtype {x.dtype}, got "
                             f"{tuple(weight.shape)} and {weight.dtype}")
        if not (isinstance(eps, (int, float)) and eps >= 0):
            raise ValueError(f"eps: expected a non-negative number, got {eps!r}")
        return ResidualNorm(residual, weight, eps)

    def _check(self, op: str, group: Group, check):
        """Run the local checks; with validate=True, agree across `group` first."""
        self._raise_recorded_error()
        try:
            result, error = check(), None
        except (TypeError, ValueError) as e:
            result, error = None, e
        if self.validate and group.size > 1 and not self._capturing():
            self._agree(op, group, result, error)
        if error is not None:
            raise error
        return result

    def _agree(self, op: str, group: Group, sizes: Sizes | None, error: Exception | None) -> None:
        count = sizes.count if isinstance(sizes, Sizes) else 0
        mine = list(sizes.values()) if isinstance(sizes, Sizes) else []
        width = 2 + max(group.size, self.layout.attn_dp)
        row = torch.full((width,), -1, dtype=torch.int64, device=self.device)
        row[0] = 1 if error is not None else 0
        row[1] = count
        if mine:
            row[2:2 + len(mine)] = torch.tensor(mine, dtype=torch.int64)
        rows = [torch.empty_like(row) for _ in range(group.size)]
        dist.all_gather(rows, row, group=group.pg)
        if error is not None:
            raise error
        for member, other in zip(group.ranks, rows):
            if other[0].item():
                raise ValueError(f"{op}: rank {member} rejected its arguments (its own error "
                                 f"says why); no data was exchanged")
        for member, other in zip(group.ranks, rows):
            theirs = other[2:2 + int(other[1].item())].tolist()
            if theirs != mine:
                raise ValueError(f"{op}: sizes differ across ranks: rank {self.rank} passed {mine}, "
                                 f"rank {member} passed {theirs}")

    def _select(self, op: str, group: Group, nbytes: int, x: torch.Tensor, sizes: Sizes | None = None):
        if self.forced in ("reference", "nccl"):
            return self.backends[self.forced], None
        nodes = len(set(group.nodes)) if f"{group.name}/rail" in self.groups else 1
        if nodes > 1:  # across nodes: hierarchical legs or flat NCCL (the reference on CPU)
            choice = algorithms.choose_across_nodes(op, nbytes, nodes, sizes is not None and sizes.on_device,
                                                    self.tables)
            backend = "reference" if choice.backend == "nccl" and self.device.type == "cpu" else choice.backend
            return self.backends[backend], choice.algorithm
        if self.device.type == "cpu":
            return self.backends["reference"], None
        nvlink = self.backends.get("nvlink")
        kernel_op = "gather_tokens" if op == "gather_tokens_norm" else op

        def blocker(algorithm: str) -> str | None:
            if nvlink is None:
                return "nvlink backend not loaded"
            return nvlink.blocker(kernel_op, algorithm, group, x, sizes)

        choice = algorithms.choose(op, nbytes, blocker, self.table)
        return self.backends[choice.backend], choice.algorithm

    def _raise_recorded_error(self) -> None:
        nvlink = self.backends.get("nvlink")
        if nvlink is not None:
            nvlink.raise_recorded_error()

    def _capturing(self) -> bool:
        return self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()

    def __repr__(self) -> str:
        return (f"Communicator(rank={self.rank}, layout={self.layout.name}, device={self.device}, "
                f"backends={sorted(self.backends)})")
