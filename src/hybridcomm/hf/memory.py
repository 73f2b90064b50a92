"""How many decoder layers of a config fit when the whole model sits on one device: the
single-device reference that `bench model` checks against must fit on one GPU.

Counted from the model's structure on the meta device (nothing is allocated): the bytes of
the parameters outside the decoder layers (embeddings, final norm, lm_head) and of one
decoder layer, at the given dtype.
"""

from __future__ import annotations

import torch

RESERVE_BYTES = 10 << 30  # CUDA context, NCCL and hybridcomm buffers, KV cache, one check batch's activations


def parameter_bytes(config, dtype: torch.dtype) -> int:
    from .build import meta_model
    from .parallel import _model_class

    model = meta_model(_model_class(config), config)
    return sum(p.numel() for p in model.parameters()) * torch.finfo(dtype).bits // 8


def layer_bytes(name: str, dtype: torch.dtype) -> tuple[int, int]:
    """(bytes outside the decoder layers, bytes of one decoder layer) of configs.CONFIGS[name]
    (its layers are alike: the configs here have no dense first layers at 1-2 layers)."""
    from . import configs

    one, two = (parameter_bytes(configs.make(name, n), dtype) for n in (1, 2))
    return 2 * one - two, two - one


def fit_layers(name: str, device_bytes: int, dtype: torch.dtype, reserve: int = RESERVE_BYTES) -> int:
    """The most decoder layers whose whole model (plus `reserve`) fits in `device_bytes`."""
    fixed, per_layer = layer_bytes(name, dtype)
    layers = (device_bytes - reserve - fixed) // per_layer
    if layers < 1:
        raise ValueError(f"{name}: one layer ({per_layer / 2**30:.1f} GiB) plus the rest of the model "
                         f"({fixed / 2**30:.1f} GiB) does not fit in {device_bytes / 2**30:.1f} GiB")
    return int(layers)
