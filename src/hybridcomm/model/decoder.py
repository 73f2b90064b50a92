"""One decode step of the reference MoE decoder, for any share of the model.

The building blocks below compute a *share*: some heads, some experts, a slice of each
expert's intermediate dim. Their outputs are partial sums; a transitions object says
where the sums happen. On a rank of a layout that is the Communicator (gather_tokens /
scatter_tokens); in the single-process reference, which holds the whole model, nothing
is partial and the transitions are local (see reference.py). Everything is shaped by
Python ints only (no .item(), no data-dependent shapes), so a step can be captured in a
CUDA graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..communicator import Communicator
from .config import ModelConfig, Shard
from .weights import DpBatch, LayerWeights, ModelWeights, route_offsets


def attention_bias(lengths: torch.Tensor, positions: int, dtype: torch.dtype) -> torch.Tensor:
    """(n, 1, 1, positions) in `dtype`: 0 on positions 0..lengths, -inf after."""
    hidden = torch.arange(positions, device=lengths.device)[None, :] > lengths[:, None]
    bias = torch.zeros(hidden.shape, dtype=dtype, device=lengths.device).masked_fill_(hidden, float("-inf"))
    return bias[:, None, None, :]


# -- once per step ------------------------------------------------------------------------
class StepState:
    """What every layer of a step shares, built once per step (on the device, so it is
    part of a captured graph): the (row, position) index of the step's KV write, the
    attention bias, and one zeroed fp32 buffer holding every layer's dense router gates.

    rows, lengths: (n,) index tensors of `write_kv`; bias: (n, 1, 1, positions) in the
    query dtype, 0 on the visible positions 0..lengths and -inf after (what
    scaled_dot_product_attention makes of a boolean mask, made once instead of per
    layer); gates: (layers, tokens, experts) fp32 zeros, layer l's router scatters into
    gates[l]."""

    def __init__(self, lengths: torch.Tensor, positions: int, dtype: torch.dtype, layers: int,
                 tokens: int, experts: int):
        device = lengths.device
        self.rows, self.lengths = torch.arange(lengths.shape[0], device=device), lengths
        self.bias = attention_bias(lengths, positions, dtype)
        self.gates = torch.zeros((layers, tokens, experts), device=device)

    @classmethod
    def for_step(cls, cfg: ModelConfig, k_cache: torch.Tensor, lengths: torch.Tensor,
                 tokens: int) -> "StepState":
        """k_cache: one layer's (n, positions, heads, head_dim); tokens: the MoE's rows."""
        return cls(lengths, k_cache.shape[1], k_cache.dtype, cfg.layers, tokens, cfg.experts)


# -- attention ----------------------------------------------------------------------------
def input_norm(x: torch.Tensor, weight_f32: torch.Tensor, eps: float) -> torch.Tensor:
    """`hybridcomm.norm.rms_norm` (fp32 math, one rounding) with the weight already in fp32;
    F.rms_norm is one fused kernel on CUDA (aten._fused_rms_norm) where its parts are 6."""
    return F.rms_norm(x.float(), (x.shape[-1],), weight_f32, eps).to(x.dtype)


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor,
             k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor | None = None) -> None:
    """Store the step's k, v (n, heads, head_dim) at position lengths of each request: one
    index_put_ per cache (rows: arange(n), made once per step by StepState). Repeating a
    step rewrites the same slot, so graph replays stay valid."""
    if rows is None:
        rows = torch.arange(k.shape[0], device=k.device)
    k_cache.index_put_((rows, lengths), k)
    v_cache.index_put_((rows, lengths), v)


def cached_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     lengths: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Single-query attention: q (n, heads, d) over cache positions 0..lengths inclusive.
    The mask (bias: `StepState.bias`, built here when not given) replaces variable
    lengths, so shapes never depend on the data. The caches (n, positions, heads, d)
    enter as transposed views: copying them would cost more than the attention itself."""
    if q.shape[0] == 0:  # an empty DP group: nothing to attend; keeps fused kernels off 0-size batches
        return q.clone()
    if bias is None:
        bias = attention_bias(lengths, k_cache.shape[1], q.dtype)
    out = F.scaled_dot_product_attention(q.unsqueeze(2), k_cache.transpose(1, 2),
                                         v_cache.transpose(1, 2), attn_mask=bias)
    return out.squeeze(2)


def attention(x: torch.Tensor, w: LayerWeights, k_cache: torch.Tensor, v_cache: torch.Tensor,
              lengths: torch.Tensor, head_dim: int, step: StepState | None = None) -> torch.Tensor:
    """This share's heads: QKV projection (one matmul), KV write, attention, and their
    rows of o_proj. Row-parallel o_proj makes the result partial over the shares of the heads."""
    n, heads = x.shape[0], w.o.shape[0] // head_dim
    q, k, v = (x @ w.qkv).view(n, 3, heads, head_dim).unbind(1)
    write_kv(k_cache, v_cache, lengths, k, v, None if step is None else step.rows)
    out = cached_attention(q, k_cache, v_cache, lengths, None if step is None else step.bias)
    return out.reshape(n, heads * head_dim) @ w.o


# -- MoE ----------------------------------------------------------------------------------
def route_logits(logits: torch.Tensor, top_k: int, offsets: torch.Tensor | None = None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """`route` from the router logits (tokens, experts), in the model dtype. out: a zeroed
    fp32 (tokens, experts) buffer to scatter the gates into (default: a new one)."""
    # logits + fp32 offsets computes in fp32: exactly logits.float() + offsets.
    scores = logits.float() if offsets is None else logits + offsets
    chosen = scores.topk(top_k, dim=-1).indices
    if out is None:
        out = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
    return out.scatter_(1, chosen, torch.softmax(logits.gather(1, chosen), dim=-1, dtype=torch.float32))


def route(x: torch.Tensor, router: torch.Tensor, top_k: int,
          offsets: torch.Tensor | None = None) -> torch.Tensor:
    """Dense fp32 gates (tokens, experts). The chosen experts are the top_k of the router
    logits + `offsets` (fp32 (tokens, experts), the routing margin: see
    ModelConfig.route_margin and `route_offsets`); their gates are the softmax over
    their raw logits, without the offsets, and 0 elsewhere. Without offsets (or all-zero
    ones) this is the plain top-k router: the renormalised top-k softmax."""
    return route_logits(x @ router, top_k, offsets)


def expert_mlp(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """SwiGLU of a stack of experts (or intermediate slices of them) on every token:
    x (tokens, hidden) -> (experts, tokens, hidden), each expert's output on its own. The
    decoder does not use it (see `combine_experts`); it is the plain form, for tests."""
    return (F.silu(x @ gate) * (x @ up)) @ down


def combine_experts(gate_up: torch.Tensor, gates: torch.Tensor, w: LayerWeights) -> torch.Tensor:
    """gate_up: (tokens, E, 2, I) gate and up projections of this share's experts on
    every token; gates: dense fp32 (tokens, experts) of every expert. Returns
    sum_e gates[:, e] * (silu(gate_e) * up_e) @ down_e: the gate scales each expert's
    activation (in fp32, rounded once to the model dtype), and one matmul over the
    (expert, intermediate) pairs does every down projection and the sum over experts
    (fp32 accumulation). Partial over the shares of experts and intermediate slices."""
    e, i = w.down.shape[:2]
    return expert_activations(gate_up, gates, w) @ w.down.view(e * i, -1)


def expert_activations(gate_up: torch.Tensor, gates: torch.Tensor, w: LayerWeights) -> torch.Tensor:
    """The down projections' input (tokens, E * I): silu(gate) * up of this share's experts,
    times each token's gate of the expert (in fp32, rounded once to the model dtype)."""
    t, e, _, i = gate_up.shape
    act = F.silu(gate_up[:, :, 0]) * gate_up[:, :, 1]  # (tokens, E, I)
    local = gates[:, w.first_expert : w.first_expert + e, None]
    return (act * local).to(gate_up.dtype).view(t, e * i)


def moe(x: torch.Tensor, gates: torch.Tensor, w: LayerWeights) -> torch.Tensor:
    """This share's experts, densely over all tokens (a token not routed to an expert has
    gate 0 there). Partial over the shares of experts and intermediate slices."""
    t, e, i = x.shape[0], w.down.shape[0], w.down.shape[1]
    return combine_experts((x @ w.gate_up.reshape(x.shape[1], -1)).view(t, e, 2, i), gates, w)


def moe_block(x: torch.Tensor, w: LayerWeights, top_k: int, offsets: torch.Tensor | None,
              gates_out: torch.Tensor | None = None) -> torch.Tensor:
    """Router and this share's experts on x (every token): one matmul for the router's
    and the experts' gate / up columns (`LayerWeights.router_experts`), then `route_logits`
    and `combine_experts`. Equals moe(x, route(x, w.router, top_k, offsets), w)."""
    t, e, i = x.shape[0], w.down.shape[0], w.down.shape[1]
    projected = x @ w.router_experts
    gate_up = projected[:, :w.expert_columns].view(t, e, 2, i)
    gates = route_logits(projected[:, w.expert_columns:], top_k, offsets, gates_out)
    return combine_experts(gate_up, gates, w)


def dense_experts(x: torch.Tensor, w: LayerWeights, layer: int, top_k: int, offsets: torch.Tensor | None,
                  gates_out: torch.Tensor | None = None) -> torch.Tensor:
    """The decoder's default `experts`: `moe_block` on 16-bit gathered rows."""
    return moe_block(x, w, top_k, offsets, gates_out)


# -- the layer ----------------------------------------------------------------------------
class CommTransitions:
    """Where a rank's partial sums meet: the Communicator's token transitions. quant_args:
    gather_tokens' quant= / global_scale= (then the gather returns QuantizedRows)."""

    def __init__(self, comm: Communicator, dp_sizes, quant_args: dict | None = None):
        self.comm, self.dp_sizes, self.quant_args = comm, dp_sizes, quant_args or {}

    def gather(self, o_partial, residual, norm_weight, eps):
        return self.comm.gather_tokens(o_partial, self.dp_sizes, partial=True, residual=residual,
                                       norm_weight=norm_weight, eps=eps, **self.quant_args)

    def scatter(self, y_partial):
        if self.comm.layout.attn_dp == 1:
            # No DP: the one group owns every token, so this is a plain all-reduce.
            return self.comm.all_reduce(y_partial)
        return self.comm.scatter_tokens(y_partial, self.dp_sizes)


def decoder_layer(h: torch.Tensor, w: LayerWeights, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  lengths: torch.Tensor, cfg: ModelConfig, transitions,
                  offsets: torch.Tensor, step: StepState | None = None,
                  layer: int = 0, experts=dense_experts) -> torch.Tensor:
    """h: this DP group's rows -> the same rows after one layer.

    transitions.gather(o_partial, residual, norm_weight, eps) -> (normed rows of every DP
    group, residual rows of this group): the only place the post-attention residual add
    and norm happen. transitions.scatter(y_partial) -> this group's reduced rows.
    offsets: the routing offsets of every gathered row (`route_offsets`).
    step: what the step's layers share (`StepState`; built here when not given), and
    `layer` this layer's index into it.
    experts(gathered, w, layer, top_k, offsets, gates_out) -> the partial MoE output:
    `dense_experts` for 16-bit rows, model/quantized.py's for quantized ones.
    """
    if step is None:
        step, layer = StepState(lengths, k_cache.shape[1], k_cache.dtype, 1, offsets.shape[0], cfg.experts), 0
    o_partial = attention(input_norm(h, w.input_norm_f32, cfg.eps), w, k_cache, v_cache, lengths,
                          cfg.head_dim, step)
    normed_all, residual = transitions.gather(o_partial, h, w.post_attn_norm, cfg.eps)
    y_partial = experts(normed_all, w, layer, cfg.top_k, offsets, step.gates[layer])
    return residual + transitions.scatter(y_partial)


def decode_step(weights: ModelWeights, part: DpBatch, transitions, offsets: torch.Tensor,
                experts=dense_experts) -> torch.Tensor:
    """Every layer on `part` (its caches get this step's k, v); returns the final rows.
    offsets: routing offsets of all the MoE's rows (every DP group's), the same in
    every layer. experts: see `decoder_layer`."""
    h = part.hidden
    step = StepState.for_step(weights.cfg, part.k_cache[0], part.lengths, offsets.shape[0])
    for layer, w in enumerate(weights.layers):
        h = decoder_layer(h, w, part.k_cache[layer], part.v_cache[layer], part.lengths,
                          weights.cfg, transitions, offsets, step, layer, experts)
    return h


class DistributedDecoder:
    """This rank's slice of the model, run through a Communicator.

    weights: the full model (every rank builds the same from the seed); the decoder
    keeps only this rank's heads, experts and intermediate slices.
    quant: None (16-bit gathers and experts) or a hybridcomm.quant format: the gather hands
    the MoE quantized rows, and "fp8" runs fp8 experts on them (model/quantized.py).
    """

    def __init__(self, cfg: ModelConfig, weights: ModelWeights, comm: Communicator,
                 quant: str | None = None):
        from .quantized import QuantizedMoe  # it builds on this module's blocks

        self.cfg, self.comm = cfg, comm
        self.shard = Shard.for_rank(cfg, comm.layout, comm.rank)
        self.weights = weights.shard(self.shard)
        self.quantized = None if quant is None else QuantizedMoe(self.weights, quant)
        self._offsets: dict[tuple, torch.Tensor] = {}

    def route_offsets(self, dp_sizes, device) -> torch.Tensor:
        """Routing offsets of all tokens, built on the host once per (dp_sizes, device)
        and kept: a CUDA graph captured after an eager step replays with the kept tensor."""
        key = (tuple(int(n) for n in dp_sizes), torch.device(device))
        if key not in self._offsets:
            if key[1].type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("DistributedDecoder: run one eager step with these dp_sizes "
                                   "before capturing a graph (the routing offsets are built on the host)")
            self._offsets[key] = route_offsets(self.cfg, key[0], key[1])
        return self._offsets[key]

    def forward(self, part: DpBatch, dp_sizes) -> torch.Tensor:
        """part: this rank's share of the batch (`cut_batch`): its DP group's requests,
        its heads of their caches. dp_sizes: tokens per DP group, the same on every rank.
        Returns this DP group's final hidden states (the same on its attn-TP ranks)."""
        dp = self.comm.layout.coords(self.comm.rank).attn_dp_rank
        if part.dp_index != dp:
            raise ValueError(f"DistributedDecoder: part is DP group {part.dp_index}'s, "
                             f"rank {self.comm.rank} is in DP group {dp}")
        q = self.quantized
        transitions = CommTransitions(self.comm, dp_sizes, None if q is None else q.gather_args())
        return decode_step(self.weights, part, transitions, self.route_offsets(dp_sizes, part.hidden.device),
                           dense_experts if q is None else q.experts)

    __call__ = forward
