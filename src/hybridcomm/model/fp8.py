"""The fp8 GEMM of the fp8 experts: per-token activation scales x per-channel weight scales.

    out[m, n] = bf16( sa[m] * sb[n] * sum_k a[m, k] * b[k, n] )      a, b float8_e4m3fn

a and sa are what the `fp8` quantized gather returns (QuantizedRows data (M, K) and scales
(M, 1)), used as they arrive: no dequantize. b is a weight quantized once per output column
(`Fp8Weight`, with the `fp8` format of hybridcomm.quant applied to the weight's columns).

Which implementation runs is a table keyed by the device type (`FP8_GEMMS`): on CUDA
`torch._scaled_mm` with rowwise scales (Hopper and later), on the CPU the reference below,
which is also what the tests check `_scaled_mm` against. (torch 2.13's CPU build has a rowwise
`_scaled_mm` too, and a test compares it with the reference, but the repository supports torch
>= 2.9, where the CPU kernel is not guaranteed; the reference keeps CPU runs independent of it.)

What `_scaled_mm` needs (torch/_meta_registrations and aten ScaledBlas): a (M, K) row-major,
b (K, N) column-major (here `Fp8Weight.data.t()` of a contiguous (N, K)), K and N multiples of
16 (N is padded with zero columns: `Fp8Weight.cols` are the real ones), scale_a (M, 1) and
scale_b (1, N) float32 contiguous, out_dtype bfloat16 for rowwise scaling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..quant import quantize

GEMM_ALIGN = 16  # _scaled_mm: K and N multiples of 16
OUT_DTYPE = torch.bfloat16  # rowwise _scaled_mm writes bf16; the reference rounds to it too


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


@dataclass
class Fp8Weight:
    """A (K, N) weight in float8_e4m3fn, one fp32 scale per output column (per channel).

    data: (N_pad, K) contiguous, N_pad = N rounded up to 16 (the padding columns are zero);
        data.t() is the column-major (K, N_pad) operand `_scaled_mm` reads.
    scales: (1, N_pad) fp32: column n of the weight is data[n].float() * scales[0, n].
    cols: N, the real columns (the GEMM's output has N_pad; callers slice [:, :cols]).
    """

    data: torch.Tensor
    scales: torch.Tensor
    cols: int

    @classmethod
    def quantize(cls, w: torch.Tensor) -> "Fp8Weight":
        """Per output column: scale = max(amax, 1e-10) / 448 over the column's K values, data =
        e4m3(column / scale) -- the `fp8` row format of hybridcomm.quant on w's transpose."""
        if w.dim() != 2 or w.shape[0] % GEMM_ALIGN:
            raise ValueError(f"w: the fp8 GEMM needs a 2-d (K, N) weight with K a multiple of "
                             f"{GEMM_ALIGN}, got shape {tuple(w.shape)}")
        k, n = w.shape
        columns = w.new_zeros((_round_up(n, GEMM_ALIGN), k), dtype=torch.float32)
        columns[:n] = w.t()
        q = quantize(columns, "fp8")
        return cls(q.data, q.scales.view(1, -1), n)

    def dequantize(self) -> torch.Tensor:
        """(K, cols) fp32: the values the weight stands for (checks)."""
        return (self.data.float() * self.scales.t()).t()[:, :self.cols]


def reference_gemm(a: torch.Tensor, a_scales: torch.Tensor, w: Fp8Weight) -> torch.Tensor:
    """The definition, in fp32: products of e4m3 values are exact in fp32 and the sum over K
    is fp32 (the order differs from the tensor cores': last-place differences), then the two
    scales, then one rounding to bf16. (M, N_pad)."""
    acc = a.float() @ w.data.float().t()
    return (acc * a_scales.float() * w.scales).to(OUT_DTYPE)


def scaled_mm_gemm(a: torch.Tensor, a_scales: torch.Tensor, w: Fp8Weight) -> torch.Tensor:
    """torch._scaled_mm with rowwise scales. (M, N_pad). Zero rows (every DP group empty)
    return an empty result without a launch; the shape is a Python int, so this is
    decided at capture time, not per replay."""
    if a.shape[0] == 0:
        return a.new_empty((0, w.data.shape[0]), dtype=OUT_DTYPE)
    return torch._scaled_mm(a, w.data.t(), scale_a=a_scales, scale_b=w.scales, out_dtype=OUT_DTYPE)


# Device type -> the fp8 GEMM that runs there (see the module docstring).
FP8_GEMMS: dict[str, Callable[[torch.Tensor, torch.Tensor, Fp8Weight], torch.Tensor]] = {
    "cuda": scaled_mm_gemm,
    "cpu": reference_gemm,
}


def fp8_gemm(a: torch.Tensor, a_scales: torch.Tensor, w: Fp8Weight) -> torch.Tensor:
    """a (M, K) float8_e4m3fn with a_scales (M, 1) fp32 (the `fp8` QuantizedRows) times w ->
    (M, w.cols) bf16 (a view of the padded result)."""
    gemm = FP8_GEMMS.get(a.device.type)
    if gemm is None:
        raise ValueError(f"a: no fp8 GEMM for device type {a.device.type!r}; known: {sorted(FP8_GEMMS)}")
    if a.dtype != torch.float8_e4m3fn or a.dim() != 2 or a.shape[1] != w.data.shape[1]:
        raise ValueError(f"a: expected float8_e4m3fn (M, {w.data.shape[1]}), got {a.dtype} {tuple(a.shape)}")
    if a_scales.dtype != torch.float32 or tuple(a_scales.shape) != (a.shape[0], 1):
        raise ValueError(f"a_scales: expected float32 ({a.shape[0]}, 1) (one scale per token), got "
                         f"{a_scales.dtype} {tuple(a_scales.shape)}")
    return gemm(a, a_scales, w)[:, :w.cols]
