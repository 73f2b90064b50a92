"""Residual add + RMSNorm with fp32 math: the semantics every backend implements.

    residual_out = dtype(reduced_fp32 + float(residual))          (one rounding)
    normed       = dtype(v * rsqrt(mean(v * v) + eps) * float(w)),  v = float(residual_out)
"""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """out: a tensor of x's shape and dtype to write the result into (the same rounding)."""
    v = x.float()
    scale = torch.rsqrt(v.pow(2).mean(dim=-1, keepdim=True) + eps)
    normed = v * scale * weight.float()
    return normed.to(x.dtype) if out is None else out.copy_(normed)


def add_rms_norm(reduced: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """reduced: fp32 sum; residual: rows in the output dtype. Returns (normed, residual_out);
    normed is written into `out` when given."""
    residual_out = (reduced.float() + residual.float()).to(residual.dtype)
    return rms_norm(residual_out, weight, eps, out), residual_out


class ResidualNorm:
    """The optional fusion of gather_tokens: residual add, then RMSNorm of the sum."""

    def __init__(self, residual: torch.Tensor, weight: torch.Tensor, eps: float):
        self.residual, self.weight, self.eps = residual, weight, float(eps)
