"""QuantizedRows: what a quantized gather returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .formats import FORMATS, Format

# e2m1 code (sign in bit 3) -> value
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


@dataclass
class QuantizedRows:
    """Rows of `hidden` values in a quantized format.

    data:   fp8: float8_e4m3fn (rows, hidden); nvfp4: uint8 (rows, hidden // 2), element 2k in
            the low nibble of byte k, element 2k+1 in the high nibble.
    scales: linear, (rows, hidden // block): fp32 for the fp8 formats (block = hidden for
            `fp8`, 128 for `fp8_block128`), float8_e4m3fn for nvfp4 (block 16; swizzle with
            `swizzle_128x4` for CUTLASS fp4 GEMMs).
    global_scale: nvfp4 only, the caller's fp32 global scale (a 1-element tensor).
    With device-side sizes, data and scales have capacity rows (see README).
    """

    data: torch.Tensor
    scales: torch.Tensor
    format: str
    global_scale: torch.Tensor | None = None

    @property
    def spec(self) -> Format:
        return FORMATS[self.format]

    @property
    def hidden(self) -> int:
        return self.data.shape[1] * self.spec.values_per_byte

    def map_rows(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "QuantizedRows":
        """Apply a row operation (gather, pad, slice) to data and scales alike, as raw bytes."""
        data = fn(self.data.view(torch.uint8)).view(self.data.dtype)
        scales = fn(_as_bytes_rows(self.scales)).view(self.scales.dtype)
        return QuantizedRows(data, scales, self.format, self.global_scale)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The values the quantized rows stand for, (rows, hidden) in `dtype` (for checks and
        for consumers without fp8/fp4 GEMMs; not bit-exact across implementations)."""
        spec = self.spec
        rows, hidden = self.data.shape[0], self.hidden
        if spec.name == "nvfp4":
            codes = torch.stack([self.data & 0xF, self.data >> 4], dim=-1).view(rows, hidden)
            values = e2m1_values(codes)
            unit = self.scales.float() / self.global_scale.float()
        else:
            values = self.data.float()
            unit = self.scales.float()
        block = spec.block_of(hidden)
        values = values.view(rows, hidden // block, block) * unit.view(rows, hidden // block, 1)  # rows may be 0
        return values.view(rows, hidden).to(dtype)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (uint8, sign in bit 3) -> fp32 values, E2M1_VALUES[code], computed from the
    bits (exponent e = bits 1-2, mantissa m = bit 0: m / 2 if e == 0, else 2^(e-1) (1 + m / 2))
    rather than looked up: a table would be a host-to-device copy, which a CUDA graph capture
    (the decoder's nvfp4 step) does not allow."""
    c = codes.to(torch.int32)
    e, m = ((c >> 1) & 3).float(), (c & 1).float()
    magnitude = torch.where(e == 0, m * 0.5, torch.exp2(e - 1) * (1 + m * 0.5))
    return torch.where((c & 8) != 0, -magnitude, magnitude)


def _as_bytes_rows(scales: torch.Tensor) -> torch.Tensor:
    """(rows, cols) of any element type -> (rows, cols * itemsize) uint8."""
    return scales.contiguous().view(torch.uint8)  # the last dimension grows by itemsize
