"""The reference quantizers: pure torch, the semantic truth on CPU and GPU.

Every step is one torch op on fp32 tensors, so each value is rounded once, as IEEE
round-to-nearest-even (divisions divide by full tensors: CUDA torch turns division by a
Python scalar into a multiply by its reciprocal, which rounds differently). The kernels
(csrc/quant.cuh) perform the same operations in the same order; see the package docstring.
"""

from __future__ import annotations

from typing import Callable

import torch

from .formats import AMAX_FLOOR, E2M1_MAX, E4M3_MAX, FORMATS
from .rows import QuantizedRows

# e2m1 rounding, round-to-nearest-even, saturating: the code of |q| is the number of these
# thresholds it passes; `True` marks a tie that rounds up (to the value with an even code).
E2M1_THRESHOLDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True),
                   (2.5, False), (3.5, True), (5.0, False))


def _full(like: torch.Tensor, value: float) -> torch.Tensor:
    return torch.full_like(like, value)


E4M3_NEGATIVE_NAN, E4M3_NAN = 0xFF, 0x7F  # the two NaN codes of float8_e4m3fn


def to_e4m3(v: torch.Tensor) -> torch.Tensor:
    """fp32 -> float8_e4m3fn, round-to-nearest-even, saturating to +-448; NaN -> 0x7f whatever
    its sign, so no code is 0xFF (the reserved pattern: docs/quantization.md)."""
    codes = v.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.where(codes == E4M3_NEGATIVE_NAN, E4M3_NAN, codes).view(torch.float8_e4m3fn)


def e2m1_codes(q: torch.Tensor) -> torch.Tensor:
    """fp32 -> e2m1 codes (uint8, sign in bit 3): nearest-even on the grid
    0, 0.5, 1, 1.5, 2, 3, 4, 6, saturating at 6; the sign is q's sign bit, except that zero is
    always +0 (code 0, never 0x8: the reserved pattern, docs/quantization.md). NaN gives +0."""
    a = q.abs()
    code = torch.zeros(q.shape, dtype=torch.uint8, device=q.device)
    for threshold, tie_up in E2M1_THRESHOLDS:
        code += (a >= threshold if tie_up else a > threshold).to(torch.uint8)
    negative = torch.signbit(q) & (code != 0)
    return code | (negative.to(torch.uint8) << 3)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """(rows, 2k) codes -> (rows, k) bytes: element 2k low nibble, 2k+1 high nibble."""
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def block_amax(v: torch.Tensor, block: int) -> torch.Tensor:
    """(rows, hidden) fp32 -> (rows, hidden // block) max |v| per block."""
    rows, hidden = v.shape
    return v.abs().view(rows, hidden // block, block).amax(dim=-1)


def quantize_fp8(v: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    amax = block_amax(v, block).clamp_min(AMAX_FLOOR)  # the floor as fp32, like 1e-10f (no host tensor: graphs)
    scale = amax / _full(amax, E4M3_MAX)
    inv = _full(scale, 1.0) / scale
    q = v.view(amax.shape + (block,)) * inv.unsqueeze(-1)
    return to_e4m3(q).view(v.shape), scale


def quantize_nvfp4(v: torch.Tensor, global_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    block = FORMATS["nvfp4"].block
    amax = block_amax(v, block)
    g = global_scale.float().reshape(()).expand_as(amax)
    sf = to_e4m3(g * (amax / _full(amax, E2M1_MAX)))
    sf_value = sf.float()
    inv = torch.where(sf_value == 0, _full(sf_value, 0.0), g / sf_value)
    q = v.view(amax.shape + (block,)) * inv.unsqueeze(-1)
    return pack_nibbles(e2m1_codes(q).view(v.shape)), sf


def quantize(x: torch.Tensor, format: str, global_scale: torch.Tensor | None = None) -> QuantizedRows:
    """Quantize rows x (rows, hidden; fp32 / fp16 / bf16) in `format` (see FORMATS).
    The values quantized are float(x): x is taken exactly as given, in its own dtype."""
    spec = FORMATS[format]
    v = x.float().contiguous()
    if spec.name == "nvfp4":
        data, scales = quantize_nvfp4(v, global_scale)
    else:
        data, scales = quantize_fp8(v, spec.block_of(v.shape[1]))
    return QuantizedRows(data, scales, spec.name, global_scale if spec.needs_global_scale else None)


def quantized_move(rows: torch.Tensor, quant, move: Callable[[torch.Tensor], torch.Tensor]):
    """move(rows), or, with `quant` (a QuantSpec), rows quantized and moved as raw bytes
    (data and scales alike): how the reference and NCCL backends gather quantized rows."""
    if quant is None:
        return move(rows)
    return quantize(rows, quant.format.name, quant.global_scale).map_rows(move)
