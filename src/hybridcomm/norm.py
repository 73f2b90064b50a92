"""Residual add + RMSNorm with fp32 math: the semantics every backend implements.

    residual_out = dtype(reduced_fp32 + float(residual))          (one rounding)
    normed       = dtype(v * rsqrt(mean(v * v) + eps) * float(w)),  v = float(residual_out)
"""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    v = x.float()
    scale = torch.rsqrt(v.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (v * scale * weight.float()).to(x.dtype)


def add_rms_norm(reduced: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """reduced: fp32 sum; residual: rows in the output dtype. Returns (normed, residual_out)."""
    residual_out = (reduced.float() + residual.float()).to(residual.dtype)
    return rms_norm(residual_out, weight, eps), residual_out


class ResidualNorm:
    """The optional fusion of gather_tokens: residual add, then RMSNorm of the sum."""

    def __init__(self, residual: torch.Tensor, weight: torch.Tensor, eps: float):
        self.residual, self.weight, self.eps = residual, weight, float(eps)
