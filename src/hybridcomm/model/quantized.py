"""The MoE on quantized gathered rows: what the decoder does with `gather_tokens(quant=)`.

The gather hands the MoE its input quantized (hybridcomm.quant). How the experts consume it
depends on the format (`CONSUMERS`, a table):

- fp8: fp8 experts. The gathered data and per-token scales feed `fp8_gemm` (torch._scaled_mm
  on CUDA) directly, with no dequantize: one fp8 GEMM for the router's and this share's
  experts' gate / up columns (as `moe_block`'s one bf16 matmul; the router's weights are
  quantized per column like the experts'), then the down projection on the activations,
  quantized per token on this rank (the `fp8` reference quantizer). Weights are quantized once
  per output column when the decoder is built (this rank's shard; engines load fp8
  checkpoints instead).
- nvfp4 and fp8_block128: dequantized to the model dtype, then the bf16 experts. Hopper has
  no fp4 GEMM (CUTLASS's nvfp4 GEMMs need Blackwell), and torch's _scaled_mm takes 1x128
  blockwise scales only on newer builds; for these formats what is measured is the transition.

The NCCL backend's gather with quant= is what engines do today (reduce over attention TP, add
+ RMSNorm, quantize, all-gather the data and the scales); ours is one kernel. Both hand the same
kind of QuantizedRows to the same code here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..quant import FORMATS, QuantizedRows, quantize
from .decoder import dense_experts, expert_activations, route_logits
from .fp8 import Fp8Weight, fp8_gemm
from .weights import LayerWeights, ModelWeights

# nvfp4's global scale for the decoder's gathered rows (RMS-normed, so |v| is O(1)): blocks
# with amax up to 16 keep an unsaturated e4m3 scale (g * amax / 6 <= 448). Engines calibrate it.
NVFP4_GLOBAL_SCALE = 448.0 * 6.0 / 16.0


@dataclass
class Fp8LayerWeights:
    """One layer's fp8 GEMM weights: router_experts (hidden, E*2*I + experts) and down
    (E*I, hidden), quantized per output column."""

    router_experts: Fp8Weight
    down: Fp8Weight

    @classmethod
    def quantize(cls, w: LayerWeights) -> "Fp8LayerWeights":
        e, i, hidden = w.down.shape
        return cls(Fp8Weight.quantize(w.router_experts), Fp8Weight.quantize(w.down.reshape(e * i, hidden)))


def fp8_moe_block(q: QuantizedRows, w: LayerWeights, w8: Fp8LayerWeights, top_k: int,
                  offsets: torch.Tensor | None, gates_out: torch.Tensor | None = None) -> torch.Tensor:
    """`moe_block` with fp8 GEMMs, on the gathered fp8 rows as they are. Partial over the
    shares of experts and intermediate slices, in the model dtype."""
    t, e, i = q.data.shape[0], w.down.shape[0], w.down.shape[1]
    dtype = w.down.dtype
    projected = fp8_gemm(q.data, q.scales, w8.router_experts).to(dtype)
    gate_up = projected[:, :w.expert_columns].view(t, e, 2, i)
    gates = route_logits(projected[:, w.expert_columns:], top_k, offsets, gates_out)
    act = quantize(expert_activations(gate_up, gates, w), "fp8")
    return fp8_gemm(act.data, act.scales, w8.down).to(dtype)


class Fp8Experts:
    """fp8 GEMMs fed by the gathered data and scales."""

    def __init__(self, weights: ModelWeights):
        self.layers = [Fp8LayerWeights.quantize(w) for w in weights.layers]

    def __call__(self, q: QuantizedRows, w: LayerWeights, layer: int, top_k: int, offsets, gates_out):
        return fp8_moe_block(q, w, self.layers[layer], top_k, offsets, gates_out)


def dequantized_experts(q: QuantizedRows, w: LayerWeights, layer: int, top_k: int, offsets, gates_out):
    """The 16-bit experts on the gathered rows dequantized to the model dtype."""
    return dense_experts(q.dequantize(w.down.dtype), w, layer, top_k, offsets, gates_out)


# Format -> how the experts consume its gathered rows (see the module docstring): a factory
# taking this rank's weights.
CONSUMERS: dict[str, Callable[[ModelWeights], Callable]] = {
    "fp8": Fp8Experts,
    "fp8_block128": lambda weights: dequantized_experts,
    "nvfp4": lambda weights: dequantized_experts,
}


class QuantizedMoe:
    """A quantized gather and the experts that consume it: the `quant=` / `global_scale=`
    arguments of gather_tokens, and `experts(q, w, layer, top_k, offsets, gates_out)` -> the
    partial MoE output (what `moe_block` returns for 16-bit rows)."""

    def __init__(self, weights: ModelWeights, format: str):
        if format not in CONSUMERS:
            raise ValueError(f"quant: expected one of {sorted(CONSUMERS)} or None, got {format!r}")
        self.format = format
        self.global_scale = NVFP4_GLOBAL_SCALE if FORMATS[format].needs_global_scale else None
        self.experts = CONSUMERS[format](weights)

    def gather_args(self) -> dict:
        return {"quant": self.format, "global_scale": self.global_scale}
