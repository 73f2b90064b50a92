"""The quantized formats of the token transitions: a table, one row per format.

Exact definitions (the reference quantizer and our CUDA kernels implement them bit for
bit) are in the package docstring (hybridcomm.quant) and docs/quantization.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..abi import QuantFormat

E4M3_MAX = 448.0   # largest finite float8_e4m3fn
E2M1_MAX = 6.0     # largest e2m1 value
AMAX_FLOOR = 1e-10  # fp8 formats: amax is raised to this (as fp32) so the scale is never 0


@dataclass(frozen=True)
class Format:
    name: str
    block: int | None          # elements per scale; None: the whole row (one scale per token)
    data_dtype: torch.dtype    # element type of `data` (nvfp4: uint8, two e2m1 codes per byte)
    values_per_byte: int       # data elements packed in one byte of `data`
    scale_dtype: torch.dtype   # element type of `scales`
    needs_global_scale: bool
    code: QuantFormat          # the kernels' format code (csrc/abi.h)

    def block_of(self, hidden: int) -> int:
        return hidden if self.block is None else self.block

    def scale_cols(self, hidden: int) -> int:
        return hidden // self.block_of(hidden)

    def data_cols(self, hidden: int) -> int:
        return hidden // self.values_per_byte

    def row_bytes(self, hidden: int) -> int:
        """Bytes on the wire per row: data plus scales."""
        return self.data_cols(hidden) + self.scale_cols(hidden) * self.scale_dtype.itemsize


FORMATS: dict[str, Format] = {
    "fp8": Format("fp8", None, torch.float8_e4m3fn, 1, torch.float32, False, QuantFormat.FP8),
    "fp8_block128": Format("fp8_block128", 128, torch.float8_e4m3fn, 1, torch.float32, False, QuantFormat.FP8_BLOCK128),
    "nvfp4": Format("nvfp4", 16, torch.uint8, 2, torch.float8_e4m3fn, True, QuantFormat.NVFP4),
}
