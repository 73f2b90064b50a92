"""Named model configs: tiny ones for CPU tests and the main job, real-shaped ones for GPUs.

Each entry is (transformers config class name, keyword arguments); `make(name, layers=...)`
builds the config (random weights come from hf.RandomWeights, nothing is downloaded).
"""

from __future__ import annotations

_TINY_ATTENTION = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128,
                       max_position_embeddings=256)
_MLA_TINY = dict(q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                 head_dim=8)
# DeepSeek-V3's own rope: YaRN with mscale_all_dim, which also scales the attention softmax
_YARN = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64, beta_fast=32.0, beta_slow=1.0,
             mscale=1.0, mscale_all_dim=1.0, rope_theta=10000.0)

CONFIGS = {
    # tiny: 2 layers, 8 experts top-2; every layout of world 4 divides them
    "qwen3_moe-tiny": ("Qwen3MoeConfig", dict(_TINY_ATTENTION, num_hidden_layers=2, intermediate_size=128,
                                              moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2)),
    "mixtral-tiny": ("MixtralConfig", dict(_TINY_ATTENTION, num_hidden_layers=2, intermediate_size=32,
                                           num_local_experts=8, num_experts_per_tok=2)),
    "deepseek_v3-tiny": ("DeepseekV3Config", dict(_TINY_ATTENTION, **_MLA_TINY, num_key_value_heads=4,
                                                  num_hidden_layers=2, intermediate_size=128,
                                                  moe_intermediate_size=32, n_routed_experts=8,
                                                  num_experts_per_tok=2, n_shared_experts=1, n_group=2,
                                                  topk_group=1, first_k_dense_replace=1)),
    # every feature of the real DeepSeek-V3 at CPU-test size: group-limited routing (8 groups, top 4),
    # top-8 of 32 experts, sigmoid scores with e_score_correction_bias, routed_scaling_factor and
    # norm_topk_prob (the config's defaults), a dense first layer, a shared expert, q_lora_rank, YaRN
    "deepseek_v3-featured": ("DeepseekV3Config", dict(_TINY_ATTENTION, **_MLA_TINY, num_attention_heads=8,
                                                      num_key_value_heads=8, num_hidden_layers=3,
                                                      intermediate_size=128, moe_intermediate_size=32,
                                                      n_routed_experts=32, num_experts_per_tok=8, n_shared_experts=1,
                                                      n_group=8, topk_group=4, first_k_dense_replace=1,
                                                      rope_parameters=_YARN)),
    # the main job on CPU: a small Qwen3-MoE (4 layers, 16 experts top-4)
    "qwen3_moe-small": ("Qwen3MoeConfig", dict(hidden_size=256, num_attention_heads=8, num_key_value_heads=4,
                                               head_dim=32, vocab_size=1024, num_hidden_layers=4,
                                               intermediate_size=512, moe_intermediate_size=128, num_experts=16,
                                               num_experts_per_tok=4, max_position_embeddings=512)),
    # real shapes (GPU): Qwen3-30B-A3B and DeepSeek-V3 per layer; layers chosen on the command line
    "qwen3-30b-a3b": ("Qwen3MoeConfig", dict(hidden_size=2048, num_attention_heads=32, num_key_value_heads=4,
                                             head_dim=128, vocab_size=151936, num_hidden_layers=4,
                                             intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
                                             num_experts_per_tok=8, norm_topk_prob=True,
                                             max_position_embeddings=4096)),
    "deepseek-v3": ("DeepseekV3Config", dict(hidden_size=7168, num_attention_heads=128, num_key_value_heads=128,
                                             vocab_size=129280, num_hidden_layers=2, intermediate_size=18432,
                                             moe_intermediate_size=2048, n_routed_experts=256,
                                             num_experts_per_tok=8, n_shared_experts=1, n_group=8, topk_group=4,
                                             first_k_dense_replace=0, q_lora_rank=1536, kv_lora_rank=512,
                                             qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                                             head_dim=64, max_position_embeddings=4096)),
}


def make(name: str, layers: int | None = None, **changes):
    """The named config, with `layers` hidden layers and the config arguments `changes` replaced
    where given (make("mixtral-tiny", num_local_experts=4))."""
    import transformers

    if name not in CONFIGS:
        raise ValueError(f"config: unknown name {name!r}; known: {sorted(CONFIGS)}")
    class_name, kwargs = CONFIGS[name]
    kwargs = {**kwargs, **changes}
    if layers is not None:
        kwargs["num_hidden_layers"] = layers
    return getattr(transformers, class_name)(**kwargs)
