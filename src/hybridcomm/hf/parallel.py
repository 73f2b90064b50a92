"""Entry points: parallelize a transformers model, or build its shard straight from a config
or a local checkpoint, and the unmodified single-device model from the same weights."""

from __future__ import annotations

import torch

from .build import full_model, shard_model
from .families import family_of
from .model import ParallelCausalLM
from .plan import RankPlan
from .weights import CheckpointWeights, ModelWeights, RandomWeights


def _model_class(config):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM._model_mapping[type(config)]


def parallelize(model, comm, weights=None, *, dtype: torch.dtype | None = None) -> ParallelCausalLM:
    """`model` (a transformers causal LM, materialised or on the meta device) as DP attention x
    EP MoE on `comm`'s layout, on comm.device. Weights come from `weights` (RandomWeights,
    CheckpointWeights, ...) or, when not given, from the model's own tensors (each rank copies
    only its shard). The model itself is left unchanged."""
    family = family_of(model.config)
    if weights is None:
        if any(p.is_meta for p in model.parameters()):
            raise ValueError("weights: the model is on the meta device; pass weights= (RandomWeights(seed) "
                             "or CheckpointWeights(path, family))")
        weights = ModelWeights(model)
    dtype = dtype or next(model.parameters()).dtype
    plan = RankPlan.make(model.config, family, comm.layout, comm.rank)
    shard = shard_model(type(model), model.config, family, plan, weights, comm.device, dtype)
    return ParallelCausalLM(shard, comm, family, plan)


def from_config(config, comm, seed: int = 0, dtype: torch.dtype = torch.float32) -> ParallelCausalLM:
    """This rank's shard of a model with RandomWeights(seed) drawn on comm.device."""
    family = family_of(config)
    plan = RankPlan.make(config, family, comm.layout, comm.rank)
    shard = shard_model(_model_class(config), config, family, plan, RandomWeights(seed, comm.device),
                        comm.device, dtype)
    return ParallelCausalLM(shard, comm, family, plan)


def from_pretrained(path, comm, dtype: torch.dtype = torch.bfloat16) -> ParallelCausalLM:
    """This rank's shard of a local checkpoint directory (config.json + *.safetensors):
    each rank reads only the tensors (and experts) it holds."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    family = family_of(config)
    plan = RankPlan.make(config, family, comm.layout, comm.rank)
    shard = shard_model(_model_class(config), config, family, plan, CheckpointWeights(path, family),
                        comm.device, dtype)
    return ParallelCausalLM(shard, comm, family, plan)


def reference_model(config, weights=None, device="cpu", dtype: torch.dtype = torch.float32, seed: int = 0):
    """The unmodified transformers model, whole, with the same weights a shard gets
    (default: RandomWeights(seed) drawn on `device`)."""
    weights = weights if weights is not None else RandomWeights(seed, device)
    return full_model(_model_class(config), config, weights, torch.device(device), dtype)
