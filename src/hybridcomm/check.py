"""Op correctness checks: cases, deterministic inputs, and an independent oracle.

Every rank regenerates every rank's inputs from seeds, so the expected result is
computed locally, in one process, from the layout alone -- independent of any
communication. Used by the tests, `hybridcomm check` and the GPU checks.

Integer-valued data ("int") makes every sum exact, whatever the order. Random data
("randn") is compared bit for bit with the oracle's fp32 group-order sum, which is
what our kernels and the reference backend compute; NCCL (its own order, input
dtype) and the fused RMSNorm (a different reduction tree over the hidden dimension)
are compared within a tolerance instead.
"""

from __future__ import annotations

import hashlib
import random
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .arguments import split_evenly
from .layout import Layout
from .norm import add_rms_norm
from .reserved import INT_OF_WIDTH, fix_reserved

OPS = ("all_reduce", "all_gather_v", "reduce_scatter_v", "gather_tokens", "scatter_tokens")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
GROUPED_OPS = ("all_reduce", "all_gather_v", "reduce_scatter_v")
# Tolerances where bitwise equality is not expected (rtol, atol).
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


@dataclass(frozen=True)
class Case:
    op: str
    layout: Layout
    sizes: tuple[int, ...]          # per group member; per DP group for the token ops
    group: str = "world"
    row_shape: tuple[int, ...] = (8,)
    dtype: str = "float32"
    data: str = "int"               # "int" (exact), "randn", "reserved" (randn with reserved NaNs), "negative"
    partial: bool = True
    fused: bool = False
    device_sizes: bool = False      # pass sizes as an int32 tensor (inputs then carry spare rows)
    seed: int = 0

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def describe(self) -> str:
        extra = "" if self.op not in GROUPED_OPS else f" group={self.group}"
        flags = "".join([" partial=False" if not self.partial else "", " fused" if self.fused else "",
                         " device-sizes" if self.device_sizes else ""])
        return (f"{self.op}{extra} layout={self.layout.name} sizes={list(self.sizes)} "
                f"rows={self.row_shape} {self.dtype}/{self.data}{flags}")


# -- inputs ---------------------------------------------------------------------------------
SPARE_ROWS = 3  # capacity beyond the real rows when sizes live on the device


def _tensor(seed: int, shape: tuple[int, ...], case: Case, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if case.data == "int":
        t = torch.randint(-8, 9, shape, generator=g).float()
    else:
        t = torch.randn(shape, generator=g)
    t = t.to(case.torch_dtype)
    if case.data == "reserved":  # randn with every 5th element all ones (reserved.py), a NaN
        t.view(-1).view(INT_OF_WIDTH[t.element_size()])[::5] = -1
    if case.data == "negative" and t.dim() > 1:  # randn, every other row -3: nvfp4 words of eight -6.0s
        t[::2] = -3.0
    return t.to(device)


def _seed(case: Case, *parts: int) -> int:
    return hash((case.seed,) + parts) & 0x7FFFFFFF


def member_input(case: Case, rank: int, device) -> torch.Tensor:
    """The input `rank` passes (without spare rows)."""
    lay = case.layout
    c = lay.coords(rank)
    if case.op == "all_gather_v":
        members = lay.group_ranks(case.group, rank)
        rows = case.sizes[members.index(rank)]
        return _tensor(_seed(case, 1, rank), (rows,) + case.row_shape, case, device)
    if case.op in ("all_reduce", "reduce_scatter_v", "scatter_tokens"):
        rows = case.sizes[0] if case.op == "all_reduce" else sum(case.sizes)
        return _tensor(_seed(case, 2, rank), (rows,) + case.row_shape, case, device)
    # gather_tokens: partial inputs differ per rank; replicated ones only per DP group
    rows = case.sizes[c.attn_dp_rank]
    who = rank if case.partial else -1 - c.attn_dp_rank
    return _tensor(_seed(case, 3, who), (rows,) + case.row_shape, case, device)


def fusion_inputs(case: Case, dp_rank: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    rows = case.sizes[dp_rank]
    residual = _tensor(_seed(case, 4, dp_rank), (rows,) + case.row_shape, case, device)
    weight = _tensor(_seed(case, 5), case.row_shape, case, device)
    return residual, weight


def _with_spare(x: torch.Tensor, case: Case) -> torch.Tensor:
    """With device sizes the input is a buffer of the same capacity on every rank (as in an
    engine's graph), filled beyond the real rows with values that would show if read."""
    if not case.device_sizes:
        return x
    per_rank = case.op in ("all_gather_v", "gather_tokens")
    capacity = (max(case.sizes) if per_rank else sum(case.sizes)) + SPARE_ROWS
    spare = torch.full((capacity - x.shape[0],) + tuple(x.shape[1:]), 1e4, dtype=x.dtype,
                       device=x.device)
    return torch.cat([x, spare])


# -- oracle ---------------------------------------------------------------------------------
def sum_in_order(parts: list[torch.Tensor]) -> torch.Tensor:
    """fp32 sum in list order, ((p0 + p1) + p2) + ...: the order every backend promises.
    The oracle's own, so that a change to a backend's summation cannot hide from it.
    One part is returned as it is: a sum over one member is that member's values, bit for bit
    (an fp32 round trip would turn every NaN into the canonical one)."""
    if len(parts) == 1:
        return parts[0].clone()
    total = torch.zeros_like(parts[0], dtype=torch.float32)
    total.copy_(parts[0])
    for part in parts[1:]:
        total = total + part.to(torch.float32)
    return total


def group_sum(case: Case, parts: list[torch.Tensor], members) -> torch.Tensor:
    """fp32 sum of the members' parts in the defined order: across nodes, each node's members
    first (rounded to the dtype once per node), then the node partials in node order."""
    nodes = [case.layout.coords(m).node for m in members]
    if len(set(nodes)) == 1:
        return sum_in_order(parts)
    partials = [sum_in_order([p for p, n in zip(parts, nodes) if n == node]).to(case.torch_dtype)
                for node in dict.fromkeys(nodes)]
    return sum_in_order(partials)


def expected(case: Case, rank: int, device):
    """What `rank` must receive: a tensor, or (normed, residual_out) for the fused gather."""
    lay = case.layout
    inp = lambda r: fix_reserved(member_input(case, r, device))  # noqa: E731  (as every backend sees it)
    if case.op in GROUPED_OPS:
        members = lay.group_ranks(case.group, rank)
        me = members.index(rank)
        if case.op == "all_reduce":
            return group_sum(case, [inp(m) for m in members], members).to(case.torch_dtype)
        if case.op == "all_gather_v":
            return torch.cat([inp(m) for m in members])
        start = sum(case.sizes[:me])
        rows = slice(start, start + case.sizes[me])
        return group_sum(case, [inp(m)[rows] for m in members], members).to(case.torch_dtype)
    c = lay.coords(rank)
    if case.op == "scatter_tokens":
        start = sum(case.sizes[: c.attn_dp_rank])
        rows = slice(start, start + case.sizes[c.attn_dp_rank])
        everyone = range(lay.world_size)
        return group_sum(case, [inp(r)[rows] for r in everyone], everyone).to(case.torch_dtype)
    gathered, residual_out = [], None
    for d in range(lay.attn_dp):
        tp_ranks = range(d * lay.attn_tp, (d + 1) * lay.attn_tp)
        reduced = group_sum(case, [inp(r) for r in tp_ranks], tp_ranks) if case.partial else inp(d * lay.attn_tp)
        if case.fused:
            residual, weight = fusion_inputs(case, d, device)
            normed, r_out = add_rms_norm(reduced, residual, weight, 1e-6)
            gathered.append(normed)
            if d == c.attn_dp_rank:
                residual_out = r_out
        else:
            gathered.append(reduced.to(case.torch_dtype))
    out = torch.cat(gathered)
    return (out, residual_out) if case.fused else out


# -- running a case on one rank ---------------------------------------------------------------
def call_op(comm, case: Case, device):
    """Run `case` through `comm` on this rank; returns the result trimmed to its valid rows."""
    rank = comm.rank
    lay = case.layout
    x = _with_spare(member_input(case, rank, device), case)
    sizes = list(case.sizes)
    if case.device_sizes:
        sizes = torch.tensor(sizes, dtype=torch.int32, device=device)
    if case.op == "all_reduce":
        return comm.all_reduce(x, case.group)
    if case.op == "all_gather_v":
        return comm.all_gather_v(x, sizes, case.group)[: sum(case.sizes)]
    c = lay.coords(rank)
    if case.op == "reduce_scatter_v":
        me = lay.group_ranks(case.group, rank).index(rank)
        return comm.reduce_scatter_v(x, sizes, case.group)[: case.sizes[me]]
    if case.op == "scatter_tokens":
        return comm.scatter_tokens(x, sizes)[: case.sizes[c.attn_dp_rank]]
    if case.fused:
        residual, weight = fusion_inputs(case, c.attn_dp_rank, device)
        normed, r_out = comm.gather_tokens(x, sizes, case.partial, residual=_with_spare(residual, case),
                                           norm_weight=weight, eps=1e-6)
        return normed[: sum(case.sizes)], r_out[: case.sizes[c.attn_dp_rank]]
    return comm.gather_tokens(x, sizes, case.partial)[: sum(case.sizes)]


@dataclass
class Outcome:
    case: str
    rank: int
    ok: bool
    detail: str = ""
    digest: str = ""  # hash of the result, to compare ranks that must hold the same bits


def raw_bytes(t: torch.Tensor) -> bytes:
    flat = t.detach().cpu().contiguous().view(-1).view(torch.uint8)
    try:
        return flat.numpy().tobytes()
    except RuntimeError:  # torch without numpy: slower, same bytes
        return bytes(flat.tolist())


def digest(t) -> str:
    parts = t if isinstance(t, tuple) else (t,)
    h = hashlib.sha1()
    for p in parts:
        h.update(raw_bytes(p))
    return h.hexdigest()[:16]


def compare(got, want, exact: str, fused: bool = False) -> str:
    """'' if equal, else a description. exact: "all" (bit for bit), "sums" (bit for bit but
    the fused RMSNorm output, whose hidden-dim reduction tree differs), "none" (tolerance)."""
    pairs = list(zip(got, want)) if isinstance(want, tuple) else [(got, want)]
    for i, (g, w) in enumerate(pairs):
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {i}: got {tuple(g.shape)} {g.dtype}, expected {tuple(w.shape)} {w.dtype}"
        if g.numel() == 0:
            continue
        err = (g.float() - w.float()).abs().max().item()
        if exact == "all" or (exact == "sums" and not (fused and i == 0)):
            bad = (g.view(-1).view(torch.uint8) != w.view(-1).view(torch.uint8)).sum().item()
            if bad:
                return f"output {i}: {bad} bytes differ (max abs error {err:.3g})"
        else:
            rtol, atol = TOLERANCE[w.dtype]
            if not torch.allclose(g.float(), w.float(), rtol=rtol, atol=atol):
                return f"output {i}: max abs error {err:.3g} above tolerance"
    return ""


def run_case(comm, case: Case, device, exact: str) -> Outcome:
    want = expected(case, comm.rank, device)
    try:
        got = call_op(comm, case, device)
    except Exception as e:  # a failing op is a failed case, not a crashed check
        return Outcome(case.describe(), comm.rank, False, f"raised {type(e).__name__}: {e}")
    detail = compare(got, want, exact, case.fused)
    return Outcome(case.describe(), comm.rank, not detail, detail, digest(got[0] if case.fused else got))


# -- case lists -------------------------------------------------------------------------------
def _uneven(n: int, rng: random.Random, with_zero: bool = True) -> tuple[int, ...]:
    sizes = [rng.randint(1, 5) for _ in range(n)]
    if with_zero and n > 1:
        sizes[rng.randrange(n)] = 0
    return tuple(sizes)


def cases_for_layout(layout: Layout, dtypes=("float32", "bfloat16"), data: str = "int",
                     row_shape=(8,), device_sizes=(False,), seed: int = 0) -> list[Case]:
    """Every op x group x partial/fused variant of one layout, uneven sizes including zero."""
    rng = random.Random(hash((layout, seed)))
    cases = []
    for dtype in dtypes:
        for dev in device_sizes:
            base = dict(layout=layout, dtype=dtype, data=data, row_shape=row_shape,
                        device_sizes=dev, seed=rng.randrange(1 << 30))
            for group in ("world", "attn_tp", "attn_dp", "moe_tp", "moe_ep"):
                n = len(layout.group_ranks(group, 0))
                if not dev:
                    cases.append(Case("all_reduce", sizes=(rng.randint(1, 6),), group=group, **base))
                cases.append(Case("all_gather_v", sizes=_uneven(n, rng), group=group, **base))
                cases.append(Case("reduce_scatter_v", sizes=_uneven(n, rng), group=group, **base))
            dp = _uneven(layout.attn_dp, rng)
            for partial in (True, False):
                cases.append(Case("gather_tokens", sizes=dp, partial=partial, **base))
            if len(row_shape) == 1:  # the norm needs rows x hidden
                cases.append(Case("gather_tokens", sizes=_uneven(layout.attn_dp, rng), fused=True, **base))
            cases.append(Case("scatter_tokens", sizes=_uneven(layout.attn_dp, rng), **base))
    return cases


_communicators: dict = {}  # per worker: (layout, backend, table, validate, max_sms) -> Communicator, oldest use first
# Communicators on a GPU a worker keeps: beyond this the least recently used is closed. Each holds an
# nvlink workspace (up to 0.5 GiB per rank on world 8), and with 8 ranks sharing one H100 those
# test_gpu_counts.py makes (9.2 GiB per rank) filled its 80 GB. Every rank makes the same calls
# in the same order, so every rank closes the same one (close is local).
KEPT_ON_GPU = 8


def communicator(layout: Layout, backend: str = "auto", table: str = "auto", validate: bool = False,
                 max_sms: int | None = None):
    """This worker's Communicator for these settings, created once (creation is collective) and
    kept until KEPT_ON_GPU others on the GPU have been used since."""
    import torch.distributed as dist

    from . import spmd
    from .communicator import Communicator

    key = (layout, backend, table, validate, max_sms)
    comm = _communicators.pop(key, None)
    if comm is None:
        device = spmd.worker_device or ("cuda" if dist.get_backend() == "nccl" else "cpu")  # or torchrun's
        comm = Communicator(layout, device=device, backend=backend, validate=validate,
                            table=table, max_sms=max_sms)  # table: a name or a file
    _communicators[key] = comm  # now the most recent
    on_gpu = [k for k, c in _communicators.items() if c.device.type == "cuda"]
    for old in on_gpu[:-KEPT_ON_GPU]:
        _communicators.pop(old).close()
    return comm


def close_communicators(max_sms: int) -> None:
    """Close and forget this worker's communicators made with this max_sms (tests that make one
    per table free their workspaces)."""
    for key in [k for k in _communicators if k[4] == max_sms]:
        _communicators.pop(key).close()


def check_cases(cases: list[Case], backend: str, exact: str, validate: bool = False,
                table: str = "auto", max_sms: int | None = None) -> list[Outcome]:
    """Worker entry: run every case on this rank through one Communicator per layout."""
    outcomes = []
    for case in cases:
        comm = communicator(case.layout, backend, table, validate, max_sms)
        outcomes.append(run_case(comm, case, comm.device, exact))
    return outcomes


@contextmanager
def poisoned_outputs(max_sms: int | None = None):
    """Our kernels' outputs filled with a poison pattern before each op (kernels.poison_outputs),
    so that a row no thread writes shows; with max_sms, that budget's communicators closed at the
    end."""
    from . import kernels

    kernels.poison_outputs = True
    try:
        yield
    finally:
        if max_sms is not None:
            close_communicators(max_sms)


def check_poisoned_cases(cases: list[Case], backend: str = "auto", exact: str = "sums", table: str = "auto",
                         max_sms: int | None = None) -> list[Outcome]:
    """Worker entry (CUDA): check_cases under poisoned_outputs."""
    with poisoned_outputs(max_sms):
        return check_cases(cases, backend, exact, table=table, max_sms=max_sms)


def replay_sizes(rng: random.Random, count: int, capacity: int, it: int) -> list[int]:
    """Random counts for replay `it`, up to `capacity`; every third replay has a zero."""
    sizes = [rng.randint(0, capacity) for _ in range(count)]
    if it % 3 == 0:
        sizes[rng.randrange(count)] = 0
    return sizes


def capture(op):
    """(CUDA graph of one call of op, its output); op runs once on a side stream first, so
    lazy setup stays out of the capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        op()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op()
    return graph, out


def replay_check(template: Case, replays: int, capacity: int, table: str = "auto", seed: int = 0,
                 exact: str = "sums") -> dict:
    """Worker entry: capture `template`'s op once in a CUDA graph with device-side sizes at
    `capacity` rows per member, then replay it with random sizes (zeros included) and fresh
    random data, comparing every replay with the oracle. Returns mismatch details and a digest
    per replay (for the cross-rank comparison)."""
    import torch.distributed as dist

    comm = communicator(template.layout, "auto", table)
    rank, device = comm.rank, comm.device
    lay = template.layout
    count = len(template.sizes)
    gathers = template.op in ("all_gather_v", "gather_tokens")
    rows = capacity if gathers else count * capacity
    x = torch.zeros((rows,) + template.row_shape, dtype=template.torch_dtype, device=device)
    residual, weight = torch.zeros_like(x), torch.zeros(template.row_shape, dtype=x.dtype, device=device)
    sizes_dev = torch.full((count,), capacity, dtype=torch.int32, device=device)

    def op():
        if template.op == "all_gather_v":
            return comm.all_gather_v(x, sizes_dev, template.group)
        if template.op == "reduce_scatter_v":
            return comm.reduce_scatter_v(x, sizes_dev, template.group)
        if template.op == "scatter_tokens":
            return comm.scatter_tokens(x, sizes_dev)
        if template.fused:
            return comm.gather_tokens(x, sizes_dev, template.partial, residual=residual, norm_weight=weight)
        return comm.gather_tokens(x, sizes_dev, template.partial)

    graph, out = capture(op)
    outs = out if isinstance(out, tuple) else (out,)
    rng = random.Random(seed)
    failures, digests = [], []
    for it in range(replays):
        sizes = replay_sizes(rng, count, capacity, it)
        case = Case(template.op, lay, tuple(sizes), template.group, template.row_shape, template.dtype,
                    template.data, template.partial, template.fused, True, seed * 1000003 + it)
        x.fill_(1e4)  # rows beyond the counts must never be read
        inp = member_input(case, rank, device)
        x[: inp.shape[0]] = inp
        if template.fused:
            r, w = fusion_inputs(case, lay.coords(rank).attn_dp_rank, device)
            residual[: r.shape[0]] = r
            weight.copy_(w)
        sizes_dev.copy_(torch.tensor(sizes, dtype=torch.int32))
        for o in outs:
            o.fill_(float("nan"))  # poison: rows the kernel forgets stay NaN
        graph.replay()
        want = expected(case, rank, device)
        if isinstance(want, tuple):
            got = (outs[0][: want[0].shape[0]], outs[1][: want[1].shape[0]])
        else:
            got = outs[0][: want.shape[0]]
        detail = compare(got, want, exact, template.fused)
        if detail:
            failures.append(f"replay {it} sizes {sizes}: {detail}")
        digests.append(digest(got[0] if template.fused else got))
    torch.cuda.synchronize()
    comm.check_errors()
    del graph
    dist.barrier()
    return {"failures": failures[:10], "mismatches": len(failures), "digests": digests}


def cross_rank_mismatches(cases: list[Case], per_rank: list[list[Outcome]]) -> list[str]:
    """Ranks that must hold the same bits (all ranks for all_reduce(world) and the gathers;
    attn-TP peers for scatter_tokens) but do not."""
    problems = []
    for i, case in enumerate(cases):
        lay = case.layout
        if case.op in ("all_reduce", "all_gather_v"):
            classes = [lay.group_ranks(case.group, r) for r in range(lay.world_size)]
        elif case.op == "gather_tokens":
            classes = [tuple(range(lay.world_size))]
        elif case.op == "scatter_tokens":
            classes = [lay.group_ranks("attn_tp", r) for r in range(lay.world_size)]
        else:
            continue
        for members in set(classes):
            digests = {per_rank[r][i].digest for r in members}
            if len(digests) > 1:
                problems.append(f"{case.describe()}: ranks {list(members)} hold different bits")
    return problems


def failures_of(cases: list[Case], per_rank: list[list[Outcome]]) -> list[str]:
    """Everything wrong in the ranks' outcomes of check_cases, a line each: every case that failed
    on some rank, then every case whose ranks do not hold the same bits where they must."""
    failed = [f"rank {o.rank}: {o.case}: {o.detail}" for outs in per_rank for o in outs if not o.ok]
    return failed + cross_rank_mismatches(cases, per_rank)
