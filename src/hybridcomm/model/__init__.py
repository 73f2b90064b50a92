"""The reference MoE decoder: one decode step of a small DP-attention + EP/TP-MoE model,
used by the layer benchmark and the end-to-end tests.

    cfg = ModelConfig.tiny()
    weights = ModelWeights.generate(cfg)                 # the same on every rank
    batch = make_batch(cfg, dp_sizes=[3, 0, 5, 1])
    expected = reference_forward(cfg, weights, batch)    # one process, whole model
    out = DistributedDecoder(cfg, weights, comm).forward(cut_batch(batch, cfg, layout, rank),
                                                         batch.dp_sizes)
"""

from .config import ModelConfig, Shard, dtype_from_name, dtype_name
from .decoder import (CommTransitions, DistributedDecoder, StepState, attention, cached_attention,
                      combine_experts, decode_step, decoder_layer, dense_experts, expert_activations,
                      expert_mlp, input_norm, moe, moe_block, route, route_logits, write_kv)
from .reference import LocalTransitions, reference_forward
from .weights import (Batch, DpBatch, LayerWeights, ModelWeights, cut_batch, make_batch,
                      make_dp_batch, rank_part, group_route_offsets, route_offsets)

__all__ = ["ModelConfig", "Shard", "dtype_from_name", "dtype_name", "CommTransitions",
           "DistributedDecoder", "StepState", "attention", "cached_attention", "combine_experts",
           "decode_step", "decoder_layer", "dense_experts", "expert_activations", "expert_mlp", "input_norm",
           "moe", "moe_block", "route", "route_logits", "write_kv", "LocalTransitions", "reference_forward", "Batch",
           "DpBatch", "LayerWeights", "ModelWeights", "cut_batch", "make_batch",
           "make_dp_batch", "rank_part", "group_route_offsets", "route_offsets"]
