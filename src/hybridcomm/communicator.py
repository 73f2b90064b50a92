"""The Communicator: validates a call, picks a backend and algorithm, runs it.

API and semantics are a contract (README.md, API section); structure: docs/architecture.md.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from . import algorithms, selection, table_file
from .agreement import decode, describe_call, encode, exchange, rejected, status_of, verdict
from .arguments import Sizes, check_rows, check_tensor, parse_sizes, result_rows
from .backends.hierarchical import HierarchicalBackend
from .backends.reference import ReferenceBackend
from .counts import Counts, exchange as exchange_counts, in_kernel as counts_in_kernel, settle as settle_counts
from .errors import CommunicatorClosed
from .groups import Group, create_groups
from .layout import GROUP_NAMES, Layout
from .norm import ResidualNorm
from .ops import OPS
from .quant import QuantSpec, parse_quant

BACKENDS = ("auto", "reference", "nccl", "nccl_symm", "nvlink")


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


def has_nccl() -> bool:
    """Whether torch.distributed's default process group runs NCCL (for CUDA tensors)."""
    return "nccl" in str(dist.get_backend())


class Communicator:
    """Collectives and token transitions for one rank of a `Layout`.

    Construct on every rank after `torch.distributed.init_process_group`, in the same
    order as other collective setup (it creates process groups, which is collective).

    validate: before every op, agree across the world on everything that must match (op,
        group, dtype, trailing shape, rows, sizes, partial, fusion and eps) and on every
        rank's local checks, so a mismatch raises the same exception on every rank instead of
        hanging or returning garbage. Costs one all-gather of a small int64 row per op; every
        rank must make every call. README "What is checked" says what is checked without it.
    timeout_s: deadline of every wait inside our kernels (PeerTimeout on expiry).
    backend: "auto" (CPU: reference; CUDA: the selection table, whose NCCL calls run on the
        reference backend where torch.distributed has no NCCL process group), or force one of
        "reference", "nccl", "nccl_symm", "nvlink" (nvlink still falls back to NCCL where it
        cannot run; nccl_symm, a benchmark baseline: backends/nccl_symm.py).
    workspace_bytes: per peer and buffer of the nvlink workspace (see `hybridcomm info`).
    max_sms: the most SMs (blocks: one per SM at most) a kernel of ours occupies; default every SM
        of the GPU; the smallest over the ranks is used. Give it when ours run where fewer SMs are
        available than the GPU has (a green context, MPS with an active-thread limit): our
        kernels need all of their blocks resident at once, and otherwise wait until PeerTimeout.
        Also a way to leave SMs to work that runs beside ours. Larger messages take longer.
    table: the selection table (default: on CUDA the packaged table of this machine shape,
        "<GPUs per node>x<GPU>" such as "2xH200", where one exists, else algorithms.TABLE, which
        is tables/4xH200.json's rules); tests and tuning pass others. A
        table keyed by node count (algorithms.TABLES) also sets the tables across nodes. A
        string or path: a name of algorithms.NAMED_TABLES, a packaged table ("4xH200") or a
        `hybridcomm tune` file (table_file.py).
    """

    def __init__(self, layout: Layout, device=None, *, validate: bool = False,
                 timeout_s: float = 10.0, backend: str = "auto",
                 workspace_bytes: int | None = None, table: dict | None = None, max_sms: int | None = None):
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
        if max_sms is not None and (not isinstance(max_sms, int) or isinstance(max_sms, bool) or max_sms < 1):
            raise ValueError(f"max_sms: expected a positive int or None, got {max_sms!r}")
        self.layout = layout
        self.rank = dist.get_rank()
        self.device = resolve_device(device)
        self.validate = bool(validate)
        self.timeout_s = float(timeout_s)
        self.groups = create_groups(layout, self.rank, self.timeout_s)
        self.closed = False
        self.backends = {"reference": ReferenceBackend(self.groups, self.device, headers=not self.validate),
                         "hierarchical": HierarchicalBackend(self)}
        self.forced = None if backend == "auto" else backend
        if table is None and self.device.type == "cuda":  # the table measured on this machine shape, if packaged
            table = table_file.for_machine(layout.ranks_per_node or layout.world_size,
                                           torch.cuda.get_device_name(self.device))
        self.tables = algorithms.node_tables(table)
        self.table = self.tables[1]
        self.last_choice: algorithms.Choice | None = None  # of the latest call (benchmarks label with it)
        self._selections = selection.SelectionMemo()
        if self.device.type == "cuda" and backend in ("nccl", "nccl_symm") and not has_nccl():
            raise ValueError(f"backend={backend!r} needs an NCCL process group; torch.distributed runs "
                             f"{dist.get_backend()!r}")
        if self.device.type == "cuda":
            if has_nccl():  # else (gloo: ranks sharing a GPU, shared_gpu.py) the reference takes NCCL's calls
                from .backends.nccl import NcclBackend
                self.backends["nccl"] = NcclBackend(self.groups)
            if backend == "nccl_symm":
                from .backends.nccl_symm import NcclSymmBackend
                self.backends["nccl_symm"] = NcclSymmBackend(self.groups, self.device)
            if backend in ("auto", "nvlink"):
                from .backends.nvlink import NvlinkBackend
                self.backends["nvlink"] = NvlinkBackend(self, workspace_bytes, max_sms=max_sms)
        elif backend in ("nccl", "nccl_symm", "nvlink"):
            raise ValueError(f"backend={backend!r} needs a CUDA device, got {self.device}")

    # -- ops ------------------------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor, group: str = "world") -> torch.Tensor:
        """Sum over `group`; returns a new tensor."""
        g, _ = self._check("all_reduce", group, lambda g: check_tensor(x, "x", self.device),
                           lambda g, _: describe_call("all_reduce", g.name, x))
        backend, algorithm = self._select("all_reduce", g, x)
        return backend.all_reduce(x, g, algorithm)

    def all_gather_v(self, x: torch.Tensor, sizes, group: str = "world", *, quant: str | None = None,
                     global_scale=None):
        """x holds sizes[i_me] rows; returns sum(sizes) rows in group order.

        With `quant` ("fp8", "fp8_block128", "nvfp4"; nvfp4 also needs `global_scale`): each
        rank quantizes its rows and the quantized bytes travel; returns `QuantizedRows`
        (see hybridcomm.quant for the exact formats). sizes may be a `Counts` holding only
        this rank's count (exchanged here, inside our kernel where it can: counts.py; kept for
        the next op).
        """
        counts = sizes
        sizes = self._own_counts(sizes, group, gather=True)
        spec = None

        def check(g):
            nonlocal spec
            spec = parse_quant(quant, global_scale, x, self.device)
            check_tensor(x, "x", self.device)
            s = parse_sizes(sizes, g.size, self.device, "sizes")
            if s.host is not None:
                check_rows(x, "x", s.host[g.index], "sizes[{}] of this rank", g.index)
            return s

        g, s = self._check("all_gather_v", group, check, lambda g, s: describe_call("all_gather_v", g.name, x, s))
        op = "all_gather_v" if spec is None else "all_gather_v_quant"
        backend, algorithm = self._select(op, g, x, s, g.index, spec)
        s = self._settle_counts(counts, s, op, backend, algorithm, g)
        return backend.all_gather_v(x, s, g, algorithm, quant=spec)

    def reduce_scatter_v(self, x: torch.Tensor, sizes, group: str = "world") -> torch.Tensor:
        """x holds sum(sizes) rows (partial); returns this rank's sizes[i_me] rows, summed.
        sizes may be the `Counts` of an earlier op."""
        sizes = self._own_counts(sizes, group)

        def check(g):
            check_tensor(x, "x", self.device)
            s = parse_sizes(sizes, g.size, self.device, "sizes")
            if s.host is not None:
                check_rows(x, "x", sum(s.host), "sum(sizes)")
            return s

        g, s = self._check("reduce_scatter_v", group, check,
                           lambda g, s: describe_call("reduce_scatter_v", g.name, x, s))
        backend, algorithm = self._select("reduce_scatter_v", g, x, s, g.index)
        return backend.reduce_scatter_v(x, s, g, algorithm)

    def gather_tokens(self, x: torch.Tensor, dp_sizes, partial: bool = True, *,
                      residual: torch.Tensor | None = None,
                      norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
                      quant: str | None = None, global_scale=None):
        """Attention output -> MoE input: every rank gets all sum(dp_sizes) rows, reduced
        over attn-TP (when `partial`), in DP-group order.

        With `residual` and `norm_weight`: returns (normed, residual_out), where
        residual_out = reduced + residual (this DP group's rows) and normed = the gathered
        RMSNorm(residual_out) * norm_weight, computed in fp32.

        With `quant` (see all_gather_v): the rows (reduced, and normed when fused) are
        quantized by the ranks that own them and the gathered rows are `QuantizedRows`.

        dp_sizes may be a `Counts` holding only this DP group's count: it is exchanged over
        attn_dp here (inside our kernel where it can: counts.py) and kept in the Counts for the
        scatter_tokens that follows. The attn-TP ranks of a DP group pass the same count.

        partial=False promises that the attn-TP ranks of a DP group pass identical rows, and
        each backend reads every row from one of those copies: the reference takes this DP
        group's rows from this rank's own x and another group's rows from that group's rank
        with the same attn_tp index; NCCL cuts each group's rows into attn_tp contiguous
        chunks (arguments.split_evenly) and takes chunk t from attn-TP rank t (the fused
        variant: like the reference); our kernels take this group's rows from this rank and
        chunk t of another group's rows from its rank t (two_step: like NCCL). If the copies
        differ, the results differ across backends and across ranks.
        """
        world, dp = self.groups["world"], self.groups["attn_dp"]
        counts = dp_sizes
        dp_sizes = self._own_counts(dp_sizes, "attn_dp", gather=True)
        fusion = spec = None

        def check(_):
            nonlocal fusion, spec
            spec = parse_quant(quant, global_scale, x, self.device)
            check_tensor(x, "x", self.device)
            s = parse_sizes(dp_sizes, self.layout.attn_dp, self.device, "dp_sizes")
            if s.host is not None:
                check_rows(x, "x", s.host[dp.index], "dp_sizes[{}] of this DP group", dp.index)
            if (residual is None) != (norm_weight is None):
                raise ValueError("gather_tokens: pass both residual and norm_weight, or neither")
            if residual is not None:
                fusion = self._check_fusion(x, residual, norm_weight, eps)
            return s

        _, s = self._check("gather_tokens", "world", check,
                           lambda g, s: describe_call("gather_tokens", g.name, x, s, partial, fusion))
        if spec is not None:
            backend, algorithm = self._select("gather_tokens_quant", world, x, s, dp.index, spec)
            s = self._settle_counts(counts, s, "gather_tokens_quant", backend, algorithm, dp)
            return backend.gather_tokens(x, s, bool(partial), fusion, algorithm, quant=spec)
        op = "gather_tokens" if fusion is None else "gather_tokens_norm"
        backend, algorithm = self._select(op, world, x, s, dp.index)
        s = self._settle_counts(counts, s, op, backend, algorithm, dp)
        return backend.gather_tokens(x, s, bool(partial), fusion, algorithm)

    def scatter_tokens(self, y: torch.Tensor, dp_sizes) -> torch.Tensor:
        """MoE output (partial over the world, all rows) -> this DP group's rows, reduced,
        identical on its attn-TP ranks. dp_sizes may be the `Counts` of the gather."""
        dp_sizes = self._own_counts(dp_sizes, "attn_dp")

        def check(_):
            check_tensor(y, "y", self.device)
            s = parse_sizes(dp_sizes, self.layout.attn_dp, self.device, "dp_sizes")
            if s.host is not None:
                check_rows(y, "y", sum(s.host), "sum(dp_sizes)")
            return s

        world, s = self._check("scatter_tokens", "world", check,
                               lambda g, s: describe_call("scatter_tokens", g.name, y, s))
        backend, algorithm = self._select("scatter_tokens", world, y, s, self.groups["attn_dp"].index)
        return backend.scatter_tokens(y, s, algorithm)

    # -- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        """Release this rank's nvlink workspace now (symmetric memory, pinned error mirror,
        kernel handles) instead of when the object is garbage collected; waits for this
        rank's queued work first. Idempotent and local (no communication): call it on every
        rank after its last op. Every later op raises hc.CommunicatorClosed (on the CPU path
        after telling its peers, which raise too)."""
        if self.closed:
            return
        nvlink = self.backends.get("nvlink")
        if nvlink is not None:
            torch.cuda.synchronize(self.device)  # our kernels still use the buffers
            nvlink.close()
        # The reference backend holds no memory; it stays so that a closed rank can still
        # tell its peers (header exchange) that it will not take part.
        self.backends = {"reference": self.backends["reference"]}
        self._selections.clear()  # its choices name the backends just dropped
        self.closed = True

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def check_errors(self) -> None:
        """Wait for this rank's queued kernels, then raise PeerTimeout (or another error)
        if one of them recorded a failure."""
        if self.closed:
            return
        nvlink = self.backends.get("nvlink")
        if nvlink is not None:
            torch.cuda.synchronize(self.device)
            nvlink.raise_recorded_error()

    # -- helpers ----------------------------------------------------------------------------
    def _own_counts(self, sizes, group: str, gather: bool = False):
        """A `Counts` becomes every member's sizes (exchanged over `group` once); others pass.
        Every rank of the group must pass a Counts, or none (the exchange is a collective).
        A gather's Counts holding a device count may instead stay for the kernel to exchange
        (own-count mode, counts.py; _settle_counts decides once the algorithm is chosen).
        Not with validate=True: its check compares every member's count before the op."""
        if not isinstance(sizes, Counts):
            return sizes
        g = self._group(group)
        if gather and not self.validate and "nvlink" in self.backends:
            deferred = counts_in_kernel(sizes, g, self.device)
            if deferred is not None:
                return deferred
        return exchange_counts(sizes, g, self.device)

    def _settle_counts(self, counts, sizes: Sizes, op: str, backend, algorithm: str | None, group: Group) -> Sizes:
        """Own-count mode after selection: the chosen kernel exchanges the count
        (ops.Algorithm.own_count), or it is exchanged now (counts.settle)."""
        if sizes is None or sizes.own is None:
            return sizes
        return settle_counts(counts, sizes, group, self.device, self._exchanges_counts(op, backend, algorithm))

    def _exchanges_counts(self, op: str, backend, algorithm: str | None) -> bool:
        """Whether the chosen algorithm exchanges a Counts' own count itself (in our kernel, or
        in the steps of a composed one: ops.Algorithm.own_count)."""
        return backend is self.backends.get("nvlink") and OPS[op].algorithm(algorithm).own_count

    def _group(self, name: str) -> Group:
        if name not in self.groups:  # also takes the internal "<group>/node" and "<group>/rail"
            raise ValueError(f"group: unknown group name {name!r}; valid names are {list(GROUP_NAMES)}")
        return self.groups[name]

    @staticmethod
    def _message_bytes(op: str, x: torch.Tensor, sizes: Sizes | None, index: int,
                       quant: QuantSpec | None = None) -> int:
        """The bytes the selection table compares: the op's input, or its result (its
        capacity when sizes live on the device), as ops.OPS says; quantized rows count
        their data and scale bytes."""
        if OPS[op].message == "input":
            return x.numel() * x.element_size()
        row_bytes = math.prod(x.shape[1:]) * x.element_size()
        if quant is not None:
            row_bytes = quant.format.row_bytes(x.shape[1])
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

    def _check(self, op: str, group: str, check, signature):
        """Resolve the group and run the local checks -> (group, check's result).

        validate=True: then agree across the world (`signature(group, result)` is this
        rank's row). Otherwise, where the op runs on the reference backend, a rank whose
        checks failed still takes part in the op's header exchanges, so its peers raise
        instead of waiting for it."""
        self._raise_recorded_error()
        g = result = error = None
        try:
            g = self._group(group)
            if self.closed:
                raise CommunicatorClosed(f"{op}: this Communicator (rank {self.rank}, {self.layout.name}) was "
                                         f"closed; create a new one")
            result = check(g)
        except (TypeError, ValueError, CommunicatorClosed) as e:
            error = e
        if self.validate and self.layout.world_size > 1 and not self._capturing():
            self._agree(op, None if error else signature(g, result), error)
        elif error is not None and g is not None and self._on_reference() and self._nodes(g) == 1:
            # (Across nodes the legs carry no rejection: peers raise PeerTimeout after timeout_s.)
            self.backends["reference"].reject(op, g, error)
        if error is not None:
            raise error
        return g, result

    def _agree(self, op: str, sig, error: Exception | None) -> None:
        """One all-gather of a fixed-width int64 row over the world; every rank then raises
        the same exception if any rank failed its checks or two members of a group differ.
        Over the world (not the op's group) so that a rank naming another group is caught:
        with validate=True every rank must make every call."""
        world = self.groups["world"]
        if error is not None:
            row = encode(rejected(op), world.size, status_of(error), self.rank)
        else:
            row = encode(sig, world.size)
        rows = [decode(r, world.size) for r in exchange(row, world.pg, world.size, self.device)]
        members = {r: self._members_of(r, s.group) for r, (_, _, s) in zip(world.ranks, rows)}
        found = verdict(rows, list(world.ranks), members)
        if error is not None:
            raise error
        if found is not None:
            raise found[2]

    def _members_of(self, rank: int, group_code: int) -> tuple[int, ...]:
        name = GROUP_NAMES[group_code] if 0 <= group_code < len(GROUP_NAMES) else "world"
        return self.layout.group_ranks(name, rank)

    def _on_reference(self) -> bool:
        return self.forced == "reference" or self.device.type == "cpu"

    def _nodes(self, group: Group) -> int:
        """Nodes a group spans where it has rails (hierarchical legs), else 1."""
        return len(set(group.nodes)) if f"{group.name}/rail" in self.groups else 1

    def _select(self, op: str, group: Group, x: torch.Tensor, sizes: Sizes | None = None, index: int = 0,
                quant: QuantSpec | None = None):
        """(backend, algorithm) for this call: decided once per call signature (selection.py);
        afresh while torch.compile traces (once per graph; symbolic shapes do not hash)."""
        if torch.compiler.is_compiling():
            choice = self._decide(op, group, x, sizes, index, quant)
        else:
            key = selection.signature(op, group.name, x, sizes, quant)
            choice = self._selections.get(key, self.table, self.tables)
            if choice is None:
                choice = self._selections.put(key, self._decide(op, group, x, sizes, index, quant))
        self.last_choice = choice
        return self.backends[choice.backend], choice.algorithm

    def _decide(self, op: str, group: Group, x: torch.Tensor, sizes: Sizes | None, index: int,
                quant: QuantSpec | None) -> algorithms.Choice:
        if self.forced in ("reference", "nccl", "nccl_symm"):
            return algorithms.Choice(self.forced, None, f"backend={self.forced!r}")
        if group.size == 1:  # the reference reads no counts there: graphs with device-side sizes work
            return algorithms.Choice("reference", None, "a group of one rank: nothing travels")
        nodes = self._nodes(group) if quant is None else 1  # quantized gathers: flat (not across nodes yet)
        if nodes > 1:  # across nodes: the table's hierarchical legs or flat NCCL; on CPU always the legs
            choice = algorithms.choose_across_nodes(op, self._message_bytes(op, x, sizes, index), nodes,
                                                    sizes is not None and sizes.on_device, self.tables)
            if choice.backend not in self.backends:  # no NCCL (CPU, or a gloo process group)
                choice = algorithms.Choice("hierarchical", "two_shot" if op == "all_reduce" else "rail_first",
                                           "no NCCL")
            return choice
        if self.device.type == "cpu":
            return algorithms.Choice("reference", None, "CPU")
        nvlink = self.backends.get("nvlink")

        def blocker(algorithm: str) -> str | None:
            if nvlink is None:
                return "nvlink backend not loaded"
            return nvlink.blocker(op, algorithm, group, x, sizes)

        layout = self.layout.attention_name if OPS[op].on_world else None  # a transition: its layout's rules
        choice = algorithms.choose(op, self._message_bytes(op, x, sizes, index, quant), blocker, self.table, layout)
        if choice.backend not in self.backends:  # nccl without an NCCL process group
            return algorithms.Choice("reference", None, f"no NCCL process group (the table: {choice.reason})")
        return choice

    def _raise_recorded_error(self) -> None:
        nvlink = self.backends.get("nvlink")
        if nvlink is not None:
            nvlink.raise_recorded_error()

    def _capturing(self) -> bool:
        return self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()

    def __repr__(self) -> str:
        return (f"Communicator(rank={self.rank}, layout={self.layout.name}, device={self.device}, "
                f"backends={sorted(self.backends)}{', closed' if self.closed else ''})")
