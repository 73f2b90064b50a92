"""Where things live in each supported transformers architecture: data, not code.

Every family follows the same decoder-layer shape (input norm -> attention -> residual ->
post-attention norm -> MLP or MoE -> residual); a `Family` names its modules and says how
each attention weight splits over attention-TP ranks. Module paths are relative to a
decoder layer (`model.model.layers[i]`); parameter suffixes are relative to the module.
Checked against transformers 5.17 and 5.23.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class HeadSplit:
    """A weight cut by attention heads: along `dim`, in blocks of one head's width (the sum
    of the config attributes `width`), taking this TP rank's query heads ("q") or the key/
    value heads they read ("kv")."""

    dim: int
    heads: str
    width: tuple[str, ...]


ONCE = "once"  # a bias of a row-parallel projection: kept on attn-TP rank 0, zeros elsewhere

_QKV = ("head_dim",)
GQA_ATTENTION = {
    "q_proj.weight": HeadSplit(0, "q", _QKV), "q_proj.bias": HeadSplit(0, "q", _QKV),
    "k_proj.weight": HeadSplit(0, "kv", _QKV), "k_proj.bias": HeadSplit(0, "kv", _QKV),
    "v_proj.weight": HeadSplit(0, "kv", _QKV), "v_proj.bias": HeadSplit(0, "kv", _QKV),
    "o_proj.weight": HeadSplit(1, "q", _QKV), "o_proj.bias": ONCE,
}
_MLA_Q = ("qk_nope_head_dim", "qk_rope_head_dim")
MLA_ATTENTION = {  # the low-rank projections (q_a, kv_a) and their norms are replicated
    "q_proj.weight": HeadSplit(0, "q", _MLA_Q), "q_b_proj.weight": HeadSplit(0, "q", _MLA_Q),
    "kv_b_proj.weight": HeadSplit(0, "q", ("qk_nope_head_dim", "v_head_dim")),
    "o_proj.weight": HeadSplit(1, "q", ("v_head_dim",)), "o_proj.bias": ONCE,
}


@dataclass(frozen=True)
class Family:
    model_type: str
    experts_count: str          # config attribute: routed experts
    expert_intermediate: str    # config attribute: one expert's intermediate size
    attention_splits: dict
    kv_heads: str               # config attribute: heads of the k/v the attention module sees
    attention: str = "self_attn"
    mlp: str = "mlp"            # the MoE block, or the dense MLP in dense layers
    router: str = "gate"        # under the MoE block: returns (logits, weights, indices)
    experts: str = "experts"    # under the MoE block: fused 3-D gate_up_proj / down_proj
    shared_experts: str | None = None  # under the MoE block: a dense MLP added to the experts
    input_norm: str = "input_layernorm"
    post_attention_norm: str = "post_attention_layernorm"
    fused_norm: bool = True     # the post-attention norm is plain RMSNorm: gather_tokens may fuse it
    dense_projections: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    # checkpoints on disk: per-expert weights (gate, up, down) and renamed module paths
    disk_expert_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    disk_renames: dict = field(default_factory=dict)
    # module attributes that follow the local head counts after the TP split
    head_attributes: tuple[str, ...] = ("num_key_value_groups",)


FAMILIES = {f.model_type: f for f in (
    Family("qwen3_moe", "num_experts", "moe_intermediate_size", GQA_ATTENTION, "num_key_value_heads"),
    Family("mixtral", "num_local_experts", "intermediate_size", GQA_ATTENTION, "num_key_value_heads",
           disk_expert_names=("w1", "w3", "w2"), disk_renames={".mlp.": ".block_sparse_moe."}),
    Family("deepseek_v3", "n_routed_experts", "moe_intermediate_size", MLA_ATTENTION, "num_attention_heads",
           shared_experts="shared_experts", head_attributes=("num_key_value_groups", "num_heads")),
)}


class UnsupportedModel(ValueError):
    """The model's architecture is not in FAMILIES, or lacks a module its family names."""


def family_of(config) -> Family:
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        raise UnsupportedModel(f"model_type {model_type!r} is not supported by hybridcomm.hf; supported: "
                               f"{sorted(FAMILIES)} (add a Family to hybridcomm/hf/families.py)")
    return FAMILIES[model_type]


def head_width(config, names: tuple[str, ...]) -> int:
    def one(name):
        value = getattr(config, name, None)
        if name == "head_dim" and not value:
            value = config.hidden_size // config.num_attention_heads
        return value
    return sum(one(n) for n in names)
