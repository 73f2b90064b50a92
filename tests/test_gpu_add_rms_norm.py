"""The fused residual add + RMSNorm kernel (csrc/add_rms_norm.cu) that the NCCL baseline runs
between its collectives (backends/nccl.py engine_add_rms_norm), against norm.py's torch ops
on random data. residual_out bit for bit; normed within one unit in the last place in 16 bits
(its sum runs in another order), fp32 within the fused gather's tolerance. Every dtype, hidden
sizes of whole lanes, 0 rows up to more rows than the kernel has blocks (its grid-stride
loop), into a given output; and the NCCL backend's fused gather at world 1 through it, against
the reference backend. One GPU."""

import pytest
import torch

from conftest import needs_gpus
from hybridcomm import kernels
from hybridcomm.check import TOLERANCE
from hybridcomm.norm import add_rms_norm

pytestmark = [pytest.mark.gpu, needs_gpus(1)]

ORDERED_INT = {torch.bfloat16: (torch.int16, 1 << 15), torch.float16: (torch.int16, 1 << 15),
               torch.float32: (torch.int32, 1 << 31)}


def ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance between a and b in units in the last place (sign-magnitude bits mapped
    to ordered integers)."""
    if a.numel() == 0:
        return 0
    int_type, sign = ORDERED_INT[a.dtype]

    def ordered(t):
        i = t.view(int_type).long()
        return torch.where(i < 0, -sign - i, i)

    return int((ordered(a) - ordered(b)).abs().max())


def _close(got: torch.Tensor, want: torch.Tensor, what) -> None:
    """16-bit: within one unit in the last place. fp32: within the fused gather's tolerance
    (check.TOLERANCE): another summation order moves the scale by a few fp32 units, which a
    16-bit result rounds away and an fp32 one keeps."""
    if got.dtype == torch.float32:
        rtol, atol = TOLERANCE[got.dtype]
        assert torch.allclose(got, want, rtol=rtol, atol=atol), (what, (got - want).abs().max().item())
    else:
        assert ulps(got, want) <= 1, (what, ulps(got, want))


def _inputs(rows: int, hidden: int, dtype: torch.dtype, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    new = lambda *shape, scale=1.0: (torch.randn(*shape, device="cuda", generator=g) * scale).to(dtype)  # noqa: E731
    return new(rows, hidden, scale=3.0), new(rows, hidden), new(hidden, scale=0.5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("hidden", [4, 1040, 2048, 4096, 7168])
def test_fused_add_rms_norm_matches_the_torch_ops(dtype, hidden):
    for i, rows in enumerate([0, 1, 3, 64, 1500]):
        reduced, residual, weight = _inputs(rows, hidden, dtype, seed=hidden + i)
        assert kernels.add_rms_norm_fits(reduced, residual, weight)
        normed, residual_out = kernels.add_rms_norm(reduced, residual, weight, 1e-6)
        want_normed, want_residual = add_rms_norm(reduced, residual, weight, 1e-6)
        assert torch.equal(residual_out.view(torch.uint8), want_residual.view(torch.uint8)), (rows, hidden)
        _close(normed, want_normed, (rows, hidden))
        out = torch.full_like(residual, float("nan"))
        written, _ = kernels.add_rms_norm(reduced, residual, weight, 1e-6, out=out)
        assert written is out and torch.equal(out, normed)


def test_tensors_the_kernel_does_not_take():
    reduced, residual, weight = _inputs(4, 2048, torch.bfloat16, seed=1)
    assert not kernels.add_rms_norm_fits(reduced.float(), residual, weight)  # mixed dtypes
    assert not kernels.add_rms_norm_fits(reduced.cpu(), residual.cpu(), weight.cpu())  # not CUDA
    odd = [t[..., :3].contiguous() for t in (reduced, residual)] + [weight[:3]]
    assert not kernels.add_rms_norm_fits(*odd)  # 6-byte rows: not whole lanes
    assert not kernels.add_rms_norm_fits(reduced.t(), residual.t(), weight)  # not contiguous


def _nccl_fused_gather_world_1() -> int:
    """Calls of the fused kernel by the NCCL backend's fused gather (checked against the reference)."""
    import hybridcomm as hc

    calls = []
    launch = kernels.add_rms_norm
    kernels.add_rms_norm = lambda *args, **kw: calls.append(1) or launch(*args, **kw)
    try:
        comm = hc.Communicator(hc.Layout(1), backend="nccl")
        reference = hc.Communicator(hc.Layout(1), backend="reference")
        x, residual, weight = _inputs(5, 4096, torch.bfloat16, seed=3)
        got = comm.gather_tokens(x, [5], residual=residual, norm_weight=weight, eps=1e-6)
        want = reference.gather_tokens(x, [5], residual=residual, norm_weight=weight, eps=1e-6)
    finally:
        kernels.add_rms_norm = launch
    assert torch.equal(got[1], want[1])
    _close(got[0], want[0], "nccl fused gather")
    return len(calls)


def test_nccl_fused_gather_runs_the_kernel(pool):
    assert pool(1, "cuda").run(_nccl_fused_gather_world_1, timeout=300) == [1]
