"""Materialise a transformers model's structure with chosen tensors: the full model (the
single-device reference) or one rank's shard. The structure is built on the meta device,
so nothing a rank does not own is ever allocated; then every parameter and persistent
buffer is replaced by its tensor from a weight source.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from .families import Family, UnsupportedModel
from .plan import RankPlan, cut, fraction, head_rows, rule_for

ROTARY = "model.rotary_emb"  # non-persistent buffers (inv_freq): rebuilt on the device
# transformers' experts implementation on CUDA, per dtype: both capture in CUDA graphs and skip
# the routes of experts a rank does not own; grouped_mm (one grouped GEMM) takes bf16 only,
# batched_mm (gathers one weight matrix per route: small models only) takes any dtype.
CUDA_EXPERTS = {torch.bfloat16: "grouped_mm"}
CUDA_EXPERTS_OTHER = "batched_mm"
# implementations that skip a route whose expert index is num_experts (not on this rank) in
# transformers 5.17 and 5.23; a shard given any other (e.g. "eager": one_hot over num_experts
# classes fails in 5.17's DeepSeek-V3) runs batched_mm
SKIPS_FOREIGN_EXPERTS = ("grouped_mm", "batched_mm")


def meta_model(model_class, config):
    with torch.device("meta"):
        return model_class(config)


def layers(model):
    return model.model.layers


def is_moe_layer(model, family: Family, index: int) -> bool:
    mlp = getattr(layers(model)[index], family.mlp)
    return hasattr(mlp, family.experts)


def check_structure(model, family: Family) -> None:
    """Raise UnsupportedModel naming the first module the family table expects but is missing."""
    missing = [p for p in ("model.embed_tokens", "model.layers", "model.norm", "lm_head", ROTARY)
               if _get(model, p) is None]
    for i, layer in enumerate(layers(model) if not missing else []):
        names = [family.attention, family.input_norm, family.post_attention_norm, family.mlp]
        missing += [f"model.layers.{i}.{n}" for n in names if _get(layer, n) is None]
        if not missing and is_moe_layer(model, family, i):
            moe = f"{family.mlp}.{family.router}", f"{family.mlp}.{family.experts}.gate_up_proj"
            extra = (f"{family.mlp}.{family.shared_experts}",) if family.shared_experts else ()
            missing += [f"model.layers.{i}.{n}" for n in moe + extra if _get(layer, n) is None]
    if missing:
        raise UnsupportedModel(f"{type(model).__name__} ({family.model_type}): hybridcomm.hf expects "
                               f"modules that this model lacks: {missing[:5]}")


def _get(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _set_tensor(model, name: str, tensor: torch.Tensor, is_param: bool) -> None:
    owner_path, _, attr = name.rpartition(".")
    owner = _get(model, owner_path) if owner_path else model
    if is_param:
        setattr(owner, attr, nn.Parameter(tensor, requires_grad=False))
    else:
        owner.register_buffer(attr, tensor, persistent=True)


def _entries(model):
    """(name, shape, is_param) of every parameter and persistent buffer, tied ones once."""
    persistent = set(model.state_dict().keys())
    out = [(n, tuple(p.shape), True) for n, p in model.named_parameters()]
    out += [(n, tuple(b.shape), False) for n, b in model.named_buffers() if n in persistent]
    return out


def _finish(model, config, device, dtype):
    if device.type == "cuda":
        model.set_experts_implementation(CUDA_EXPERTS.get(dtype, CUDA_EXPERTS_OTHER))
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config).to(device)
    if getattr(config, "tie_word_embeddings", False):
        model.lm_head.weight = model.model.embed_tokens.weight
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise UnsupportedModel(f"{type(model).__name__}: no weights for {left[:5]}")
    return model.eval()


def _skip(name: str, config) -> bool:
    return getattr(config, "tie_word_embeddings", False) and name == "lm_head.weight"


def _cast(t: torch.Tensor, is_param: bool, dtype, device) -> torch.Tensor:
    # persistent buffers stay fp32 (DeepSeek's e_score_correction_bias); parameters take `dtype`
    return t.to(device=device, dtype=dtype if is_param else torch.float32).contiguous()


def full_model(model_class, config, source, device, dtype):
    """The whole model with every tensor from `source` (the single-device reference)."""
    config = copy.deepcopy(config)
    model = meta_model(model_class, config)
    for name, shape, is_param in _entries(model):
        if _skip(name, config):
            continue
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            t = _stack((source.expert(name, e, shape[1:], config) for e in range(shape[0])), shape[0], dtype, device)
        else:
            t = _cast(source.tensor(name, shape, config), is_param, dtype, device)
        _set_tensor(model, name, t, is_param)
    return _finish(model, config, device, dtype)


def shard_model(model_class, config, family: Family, plan: RankPlan, source, device, dtype):
    """One rank's shard: attention heads, experts and dense-MLP slices of `plan`."""
    config = copy.deepcopy(config)
    model = meta_model(model_class, config)
    check_structure(model, family)
    moe = lambda i: is_moe_layer(model, family, i)  # noqa: E731
    for name, shape, is_param in _entries(model):
        if _skip(name, config):
            continue
        kind, detail = rule_for(name, family, moe)
        if kind == "experts":
            t = _stack((_expert_part(source.expert(name, e, shape[1:], config), detail, plan) for e in plan.experts),
                       len(plan.experts), dtype, device)
        else:
            t = _cast(_shard_tensor(name, shape, kind, detail, source, plan, config), is_param, dtype, device)
        _set_tensor(model, name, t, is_param)
    _fix_attributes(model, family, plan, config)
    model = _finish(model, config, device, dtype)
    if model.config._experts_implementation not in SKIPS_FOREIGN_EXPERTS:
        model.set_experts_implementation(CUDA_EXPERTS_OTHER)
    return model


def _stack(experts, count: int, dtype, device) -> torch.Tensor:
    """`count` experts into one (count, ...) tensor, filled one expert at a time (a DeepSeek-V3
    layer's experts stacked in fp32 first would take 45 GB)."""
    out = None
    for e, t in enumerate(experts):
        if out is None:
            out = torch.empty((count,) + tuple(t.shape), dtype=dtype, device=device)
        out[e].copy_(t)
    return out


def _shard_tensor(name, shape, kind, detail, source, plan: RankPlan, config):
    t = source.tensor(name, shape, config)
    if kind == "heads":
        return cut(t, detail.dim, head_rows(plan, detail, config))
    if kind == "dense":
        return cut(t, detail, fraction(t.shape[detail], *plan.dense_fraction, f"{name} over the world"))
    if kind in ("once", "once_world"):
        first = plan.attn_tp_rank == 0 if kind == "once" else plan.rank == 0
        return t if first else torch.zeros_like(t)
    return t


def _expert_part(t: torch.Tensor, kind: str, plan: RankPlan) -> torch.Tensor:
    """One expert's weight cut to this rank's slice of the intermediate dim; gate_up_proj is
    [gate; up] stacked on rows, down_proj has the intermediate dim as columns."""
    rows = plan.expert_slice
    if kind == "down_proj":
        return cut(t, 1, rows)
    inter = t.shape[0] // 2
    return torch.cat([cut(t, 0, rows), cut(t, 0, range(inter + rows.start, inter + rows.stop))])


def _fix_attributes(model, family: Family, plan: RankPlan, config) -> None:
    heads = plan.head_attributes(family)
    for i, layer in enumerate(layers(model)):
        attention = getattr(layer, family.attention)
        for attr, value in heads.items():
            if hasattr(attention, attr):
                setattr(attention, attr, value)
        if is_moe_layer(model, family, i):
            experts = getattr(getattr(layer, family.mlp), family.experts)
            experts.num_experts = len(plan.experts)
            experts.intermediate_dim = len(plan.expert_slice)
            experts._is_expert_parallel = True  # indices == num_experts are skipped (non-local)
            if experts.num_experts == 1:
                _second_expert_group(experts)


def _second_expert_group(experts: nn.Module) -> None:
    """Two expert groups where `experts` holds one (8 experts over moe_ep 8): each (1, ...)
    parameter becomes a stride-0 view of two (no memory). No route names the second:
    ParallelCausalLM._ffn sends the routes this rank does not own to index num_experts (now 2),
    which the implementations skip.

    Why: grouped_mm sizes its groups with torch.histc(bins=num_experts, min=0, max=num_experts - 1);
    with one expert that is min = max = 0, which histc reads as "use the data's range": a host sync,
    which fails inside CUDA-graph capture (found on 8 ranks), and a count that takes in the routes
    skipped."""
    for name, p in list(experts.named_parameters(recurse=False)):
        if p.shape[0] == 1:
            setattr(experts, name, nn.Parameter(p.data.expand(2, *p.shape[1:]), requires_grad=False))
    experts.num_experts = 2
