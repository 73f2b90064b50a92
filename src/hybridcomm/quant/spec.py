"""Checking the `quant=` / `global_scale=` arguments of the quantized gathers."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..arguments import SUPPORTED_DTYPES, same_device
from .formats import FORMATS, Format


@dataclass(frozen=True)
class QuantSpec:
    format: Format
    global_scale: torch.Tensor | None  # nvfp4: fp32, one element, on the communicator's device


def parse_quant(quant: object, global_scale: object, x: object, device: torch.device) -> QuantSpec | None:
    """None when not quantizing; raises ValueError naming the argument otherwise."""
    if quant is None:
        if global_scale is not None:
            raise ValueError("global_scale: given without quant=; only quant='nvfp4' takes a global scale")
        return None
    if not isinstance(quant, str) or quant not in FORMATS:
        raise ValueError(f"quant: unknown format {quant!r}; valid formats are {list(FORMATS)}")
    spec = FORMATS[quant]
    if isinstance(x, torch.Tensor):
        _check_rows(x, spec)
    if not spec.needs_global_scale:
        if global_scale is not None:
            raise ValueError(f"global_scale: quant={quant!r} takes no global scale (only nvfp4 does)")
        return QuantSpec(spec, None)
    return QuantSpec(spec, _global_scale(global_scale, quant, device))


def _check_rows(x: torch.Tensor, spec: Format) -> None:
    if x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"x: quant={spec.name!r} quantizes float32 / float16 / bfloat16 rows, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"x: quant={spec.name!r} needs 2-d rows x hidden, got shape {tuple(x.shape)}")
    hidden = x.shape[1]
    block = spec.block_of(hidden)
    if hidden == 0 or hidden % block:
        raise ValueError(f"x: quant={spec.name!r} quantizes blocks of {block} values, but the hidden "
                         f"size {hidden} is not a positive multiple of {block}")


def _global_scale(value: object, quant: str, device: torch.device) -> torch.Tensor:
    hint = "the fp32 global scale, e.g. 448 * 6 / amax(tensor)"
    if value is None:
        raise ValueError(f"global_scale: quant={quant!r} needs {hint}")
    if isinstance(value, torch.Tensor):
        if value.dtype != torch.float32 or value.numel() != 1:
            raise ValueError(f"global_scale: expected a float or a 1-element float32 tensor, got "
                             f"{value.dtype} of shape {tuple(value.shape)}")
        if not same_device(value.device, device):
            raise ValueError(f"global_scale: expected a tensor on {device}, got one on {value.device}")
        return value.reshape(1)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"global_scale: expected a float or a 1-element float32 tensor, got "
                         f"{type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"global_scale: expected a positive finite number ({hint}), got {value!r}")
    return torch.full((1,), float(value), dtype=torch.float32, device=device)
