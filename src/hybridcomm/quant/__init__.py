"""Quantized token transitions: fp8 and nvfp4 rows, quantized before the gather.

Formats (`FORMATS`), exact definitions -- the reference quantizer (`quantize`, pure torch)
and the kernels (csrc/quant.cuh) compute each value with the same fp32 operations in the
same order, each rounded once to nearest-even, so they agree bit for bit. `v` is
float(x) of the unquantized rows (after any reduction over attention TP and any fused
residual add + RMSNorm, rounded to x's dtype); `amax` is max |v| over a block (exact).

fp8 (block = the whole row) and fp8_block128 (block = 128), float8_e4m3fn data, fp32 scales:
    a     = max(amax, 1e-10f)                 # no zero scale: all-zero blocks quantize to 0
    scale = a / 448.0f                        # division, rounded (stored)
    inv   = 1.0f / scale                      # division, rounded
    q_i   = e4m3(clamp(v_i * inv, -448, 448)) # multiply, rounded; e4m3 nearest-even

nvfp4 (block = 16), e2m1 data two per byte (element 2k low nibble), e4m3 scales, and the
caller's fp32 global scale g (positive, finite; engines use 448 * 6 / amax(tensor)):
    s     = g * (amax / 6.0f)                 # division, then multiply, each rounded
    sf    = e4m3(clamp(s, -448, 448))         # stored scale; nearest-even
    inv   = sf == 0 ? 0 : g / float(sf)       # division, rounded
    q_i   = e2m1(v_i * inv)                   # multiply, rounded; then e2m1 below
    e2m1(q): nearest-even on the grid 0, .5, 1, 1.5, 2, 3, 4, 6, saturating at 6 (|q| > 5
    gives 6): code(|q|) = [|q| > .25] + [|q| >= .75] + [|q| > 1.25] + [|q| >= 1.75]
    + [|q| > 2.5] + [|q| >= 3.5] + [|q| > 5]; sign bit = signbit(q), but zero is always +0
    (code 0x0: the reserved pattern below).
e4m3(NaN) is 0x7f whatever the NaN's sign, so no e4m3 byte is 0xFF.

TensorRT-LLM / FlashInfer compute the same quantities with approximate reciprocals
(rcp.approx) where we divide exactly, so their bits can differ in rare last-place cases;
the formats (layout, scale meaning) are the same. Non-finite inputs are not supported.

Reserved pattern: the canonical zero and NaN codes above keep the wire of our Lamport kernel
(csrc/lamport_quant_gather.cu) free of its sentinel word 0xFFFFFFFF, except for nvfp4 words
of eight -6.0s, which that kernel swaps on the wire (docs/quantization.md).
"""

from .formats import FORMATS, Format
from .reference import quantize
from .rows import QuantizedRows
from .spec import QuantSpec, parse_quant
from .swizzle import swizzle_128x4

__all__ = ["FORMATS", "Format", "QuantizedRows", "QuantSpec", "parse_quant", "quantize", "swizzle_128x4"]
