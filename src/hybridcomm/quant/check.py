"""Correctness checks of the quantized gathers: cases, oracle, comparison.

The oracle is the reference quantizer applied to hybridcomm.check's oracle of the
unquantized result (computed locally from seeds, without communication). Data and
scales must match it bit for bit; the dequantized rows must lie within the format's
error bound of the unquantized ones (a check of the quantizer itself).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import torch

from ..check import (Case, _with_spare, capture, communicator, digest, expected, fusion_inputs, member_input,
                     poisoned_outputs, replay_sizes)
from ..layout import Layout
from .formats import E2M1_MAX, E4M3_MAX, FORMATS
from .reference import quantize
from .rows import QuantizedRows

HIDDEN = 256  # a multiple of every format's block


@dataclass(frozen=True)
class QuantCase:
    case: Case                 # the unquantized op (all_gather_v or gather_tokens)
    quant: str
    scale_tensor: bool = False  # nvfp4: pass the global scale as a device tensor

    def describe(self) -> str:
        return f"{self.case.describe()} quant={self.quant}" + (" scale-tensor" if self.scale_tensor else "")


def global_scale_for(rows: torch.Tensor) -> float:
    """The engines' recipe: map the tensor's amax to the largest nvfp4 value (448 * 6)."""
    amax = rows.float().abs().max().item() if rows.numel() else 0.0
    return E4M3_MAX * E2M1_MAX / amax if amax > 0 else 1.0


def oracle(qcase: QuantCase, rank: int, device):
    """(QuantizedRows, residual_out or None, unquantized rows, global scale) for `rank`."""
    want = expected(qcase.case, rank, device)
    rows, residual_out = want if isinstance(want, tuple) else (want, None)
    g = global_scale_for(rows) if FORMATS[qcase.quant].needs_global_scale else None
    scale = None if g is None else torch.full((1,), g, dtype=torch.float32, device=device)
    return quantize(rows, qcase.quant, scale), residual_out, rows, g


def call(comm, qcase: QuantCase, g: float | None, device):
    """Run the quantized op; returns (QuantizedRows trimmed to the valid rows, residual_out)."""
    case = qcase.case
    lay, rank = case.layout, comm.rank
    x = _with_spare(member_input(case, rank, device), case)
    sizes = list(case.sizes)
    if case.device_sizes:
        sizes = torch.tensor(sizes, dtype=torch.int32, device=device)
    scale = g
    if g is not None and qcase.scale_tensor:
        scale = torch.full((1,), g, dtype=torch.float32, device=device)
    kw = dict(quant=qcase.quant, global_scale=scale)
    total = sum(case.sizes)
    if case.op == "all_gather_v":
        return trim(comm.all_gather_v(x, sizes, case.group, **kw), total), None
    if not case.fused:
        return trim(comm.gather_tokens(x, sizes, case.partial, **kw), total), None
    dp = lay.coords(rank).attn_dp_rank
    residual, weight = fusion_inputs(case, dp, device)
    q, r_out = comm.gather_tokens(x, sizes, case.partial, residual=_with_spare(residual, case),
                                  norm_weight=weight, eps=1e-6, **kw)
    return trim(q, total), r_out[: case.sizes[dp]]


def trim(q: QuantizedRows, rows: int) -> QuantizedRows:
    return q.map_rows(lambda t: t[:rows])


def poison(q: QuantizedRows) -> None:
    """Fill data and scales with 0x7f bytes (NaN in e4m3), so rows a kernel forgets show."""
    q.data.view(torch.uint8).fill_(0x7F)
    q.scales.view(torch.uint8).fill_(0x7F)


def _bytes_differ(a: torch.Tensor, b: torch.Tensor, what: str) -> str:
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{what}: got {tuple(a.shape)} {a.dtype}, expected {tuple(b.shape)} {b.dtype}"
    bad = (a.contiguous().view(torch.uint8) != b.contiguous().view(torch.uint8)).sum().item()
    return f"{what}: {bad} bytes differ" if bad else ""


def error_bound(q: QuantizedRows, rows: torch.Tensor) -> torch.Tensor:
    """Per element: the largest |dequantized - unquantized| the format allows.
    fp8: half a step of e4m3 (2^-4 relative; 2^-10 of the scale for subnormals);
    nvfp4: half a step of e2m1 in units of the block's scale (a quarter of the value, or
    0.25 units near zero); both with slack for the rounding of scale and reciprocal."""
    spec = q.spec
    v = rows.float()
    n, hidden = v.shape
    block = spec.block_of(hidden)
    unit = q.scales.float() if spec.name != "nvfp4" else q.scales.float() / q.global_scale.float()
    unit = unit.view(n, -1, 1).expand(n, hidden // block, block).reshape(n, hidden)
    if spec.name == "nvfp4":
        return 0.25 * v.abs() * (1 + 1e-5) + 0.25 * unit
    return (2.0 ** -4 + 1e-5) * v.abs() + 2.0 ** -10 * unit


def compare_quantized(got: QuantizedRows, want: QuantizedRows, rows: torch.Tensor) -> str:
    if got.format != want.format:
        return f"format {got.format}, expected {want.format}"
    detail = _bytes_differ(got.data, want.data, "data") or _bytes_differ(got.scales, want.scales, "scales")
    if detail or rows.numel() == 0:
        return detail
    err = (got.dequantize() - rows.float()).abs()
    over = (err > error_bound(got, rows)).sum().item()
    return f"dequantized: {over} values beyond the format's error bound" if over else ""


def own_normed_rows(comm, qcase: QuantCase, device) -> torch.Tensor:
    """The communicator's own unquantized fused gather (its RMSNorm sums the hidden dimension
    in another order than torch, so its rows may differ from the oracle's in the last bit)."""
    case = qcase.case
    x = _with_spare(member_input(case, comm.rank, device), case)
    residual, weight = fusion_inputs(case, case.layout.coords(comm.rank).attn_dp_rank, device)
    sizes = list(case.sizes)
    if case.device_sizes:
        sizes = torch.tensor(sizes, dtype=torch.int32, device=device)
    normed, _ = comm.gather_tokens(x, sizes, case.partial, residual=_with_spare(residual, case),
                                   norm_weight=weight, eps=1e-6)
    return normed[: sum(case.sizes)]


def within_bound(got: QuantizedRows, rows: torch.Tensor) -> str:
    """For backends that are not bit-exact (NCCL reduces in the input dtype): the dequantized
    rows within the format's bound plus the dtype's rounding of the unquantized rows."""
    from ..check import TOLERANCE
    if got.data.shape[0] != rows.shape[0]:
        return f"got {got.data.shape[0]} rows, expected {rows.shape[0]}"
    rtol, atol = TOLERANCE[rows.dtype]
    err = (got.dequantize() - rows.float()).abs()
    over = (err > 2 * error_bound(got, rows) + atol + rtol * rows.float().abs()).sum().item()
    return f"dequantized: {over} values beyond the bound" if over else ""


def run_quant_case(comm, qcase: QuantCase, device, exact: str = "all") -> tuple[str, str]:
    """('' or what is wrong, digest of the data and scales). exact: "all" (bit for bit with the
    oracle), "own_norm" (fused cases bit for bit with the quantized own unquantized result),
    "bound" (within the format's bound: NCCL)."""
    want, want_residual, rows, g = oracle(qcase, comm.rank, device)
    try:
        if exact == "own_norm" and qcase.case.fused:
            rows = own_normed_rows(comm, qcase, device)
            want = quantize(rows, qcase.quant, want.global_scale)
        got, residual_out = call(comm, qcase, g, device)
    except Exception as e:
        return f"raised {type(e).__name__}: {e}", ""
    detail = within_bound(got, rows) if exact == "bound" else compare_quantized(got, want, rows)
    if not detail and want_residual is not None and exact != "bound":
        detail = _bytes_differ(residual_out, want_residual, "residual_out")
    return detail, digest((got.data, got.scales))


def check_quant_cases(qcases: list[QuantCase], backend: str = "auto", table: str = "auto",
                      exact: str = "all", max_sms: int | None = None) -> list[tuple[str, str]]:
    """Worker entry: run every case on this rank."""
    results = []
    for qcase in qcases:
        comm = communicator(qcase.case.layout, backend, table, max_sms=max_sms)
        results.append(run_quant_case(comm, qcase, comm.device, exact))
    return results


def quant_failures(qcases: list[QuantCase], per_rank: list[list[tuple]]) -> list[str]:
    """Everything wrong in the ranks' results of check_quant_cases (or the poisoned variant), a
    line each: every case that failed on some rank, then every case whose group members do not
    hold the same bits (a gather's result is one value on every member of its group)."""
    failed = [f"rank {r}: {q.describe()}: {res[0]}" for r, results in enumerate(per_rank)
              for q, res in zip(qcases, results) if res[0]]
    for i, q in enumerate(qcases):
        lay = q.case.layout
        group = "world" if q.case.op == "gather_tokens" else q.case.group
        for members in {lay.group_ranks(group, r) for r in range(lay.world_size)}:
            if len({per_rank[r][i][1] for r in members}) > 1:
                failed.append(f"{q.describe()}: ranks {list(members)} hold different bits")
    return failed


def check_poisoned_quant_cases(qcases: list[QuantCase], backend: str = "auto", table: str = "auto",
                               exact: str = "all", max_sms: int | None = None) -> list[tuple[str, str, str]]:
    """Worker entry (CUDA): check_quant_cases under poisoned_outputs; per case (what is wrong or
    '', the digest of its bits, "backend/algorithm" that ran or '')."""
    out = []
    with poisoned_outputs(max_sms):
        for q in qcases:
            (detail, bits), = check_quant_cases([q], backend, table, exact, max_sms=max_sms)
            ran = communicator(q.case.layout, backend, table, max_sms=max_sms).last_choice
            out.append((detail, bits, f"{ran.backend}/{ran.algorithm}" if ran else ""))
    return out


def quant_replay_check(template: QuantCase, replays: int, capacity: int, seed: int = 0, table: str = "auto",
                       own_counts: bool = False) -> dict:
    """Worker entry (CUDA): capture the quantized op once with device-side sizes at `capacity`
    rows per member, replay it with random sizes (zeros included) and fresh random data, and
    compare every replay with the oracle (fused: with the quantized own unquantized rows).
    own_counts: each rank passes only its own count (`Counts` of a device tensor), and every
    replay's learned counts (`Counts.sizes`) must equal the sizes."""
    import torch.distributed as dist

    from ..counts import Counts

    comm = communicator(template.case.layout, "auto", table)
    rank, device, case0 = comm.rank, comm.device, template.case
    count = len(case0.sizes)
    x = torch.zeros((capacity,) + case0.row_shape, dtype=case0.torch_dtype, device=device)
    residual, weight = torch.zeros_like(x), torch.zeros(case0.row_shape, dtype=x.dtype, device=device)
    sizes_dev = torch.full((count,), capacity, dtype=torch.int32, device=device)
    own = torch.full((1,), capacity, dtype=torch.int32, device=device)
    mine = case0.layout.coords(rank).attn_dp_rank if case0.op == "gather_tokens" else \
        case0.layout.group_ranks(case0.group, rank).index(rank)
    scale = torch.ones(1, dtype=torch.float32, device=device) if FORMATS[template.quant].needs_global_scale else None
    kw = dict(quant=template.quant, global_scale=scale)

    def op():
        counts = Counts(own) if own_counts else sizes_dev
        if case0.op == "all_gather_v":
            out = comm.all_gather_v(x, counts, case0.group, **kw)
        elif case0.fused:
            out = comm.gather_tokens(x, counts, case0.partial, residual=residual, norm_weight=weight, **kw)
        else:
            out = comm.gather_tokens(x, counts, case0.partial, **kw)
        return out, counts.sizes if own_counts else sizes_dev

    graph, (out, learned) = capture(op)
    choice = comm.last_choice  # (the fused oracle below runs another op)
    got_rows, got_residual = out if isinstance(out, tuple) else (out, None)
    rng = random.Random(seed)
    failures, digests = [], []
    for it in range(replays):
        sizes = replay_sizes(rng, count, capacity, it)
        qcase = replace(template, case=replace(case0, sizes=tuple(sizes), device_sizes=True, seed=seed * 1000003 + it))
        want, want_residual, rows, g = oracle(qcase, rank, device)
        if scale is not None:
            scale.fill_(g)
        x.fill_(1e4)  # rows beyond the counts must never be read
        inp = member_input(qcase.case, rank, device)
        x[: inp.shape[0]] = inp
        if case0.fused:
            r, w = fusion_inputs(qcase.case, case0.layout.coords(rank).attn_dp_rank, device)
            residual[: r.shape[0]] = r
            weight.copy_(w)
            rows = own_normed_rows(comm, qcase, device)  # eager, outside the graph
            want = quantize(rows, template.quant, want.global_scale)
        sizes_dev.copy_(torch.tensor(sizes, dtype=torch.int32))
        own.fill_(sizes[mine])
        if own_counts:
            learned.fill_(-1)
        poison(got_rows)
        graph.replay()
        got = trim(got_rows, sum(sizes))
        detail = compare_quantized(got, want, rows)
        if not detail and learned.tolist() != sizes:
            detail = f"learned counts {learned.tolist()}"
        if not detail and got_residual is not None:
            detail = _bytes_differ(got_residual[: want_residual.shape[0]], want_residual, "residual_out")
        if detail:
            failures.append(f"replay {it} sizes {sizes}: {detail}")
        digests.append(digest((got.data, got.scales)))
    torch.cuda.synchronize()
    comm.check_errors()
    del graph
    dist.barrier()
    return {"failures": failures[:10], "mismatches": len(failures), "digests": digests,
            "ran": f"{choice.backend}/{choice.algorithm}"}


def _uneven(n: int, rng: random.Random) -> tuple[int, ...]:
    sizes = [rng.randint(1, 5) for _ in range(n)]
    if n > 1:
        sizes[rng.randrange(n)] = 0
    return tuple(sizes)


def quant_cases(layout: Layout, formats=tuple(FORMATS), dtypes=("bfloat16",), device_sizes=(False, True),
                seed: int = 0, data: str = "randn") -> list[QuantCase]:
    """Every format x op variant (all_gather_v over the world and attn_dp; gather_tokens
    partial, replicated, fused) of one layout, random data, uneven sizes including zero."""
    rng = random.Random(hash((layout, seed)))
    out = []
    for fmt in formats:
        for dtype in dtypes:
            for dev in device_sizes:
                base = Case("gather_tokens", layout, (), row_shape=(HIDDEN,), dtype=dtype, data=data,
                            device_sizes=dev)
                variants = [replace(base, op="all_gather_v", group=g, sizes=_uneven(len(layout.group_ranks(g, 0)), rng))
                            for g in ("world", "attn_dp")]
                variants += [replace(base, sizes=_uneven(layout.attn_dp, rng), partial=p, fused=f)
                             for p, f in ((True, False), (False, False), (True, True))]
                for v in variants:
                    out.append(QuantCase(replace(v, seed=rng.randrange(1 << 30)), fmt,
                                         scale_tensor=bool(rng.randrange(2))))
    return out
