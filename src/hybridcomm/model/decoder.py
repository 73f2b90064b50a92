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
from ..norm import rms_norm
from .config import ModelConfig, Shard
from .weights import DpBatch, LayerWeights, ModelWeights, route_offsets


# -- attention ----------------------------------------------------------------------------
def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor,
             k: torch.Tensor, v: torch.Tensor) -> None:
    """Store the step's k, v (n, heads, head_dim) at position lengths of each request.
    Repeating a step rewrites the same slot, so graph replays stay valid."""
    rows = torch.arange(k.shape[0], device=k.device)
    k_cache[rows, lengths] = k
    v_cache[rows, lengths] = v


def cached_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     lengths: torch.Tensor) -> torch.Tensor:
    """Single-query attention: q (n, heads, d) over cache positions 0..lengths inclusive.
    The mask replaces variable lengths, so shapes never depend on the data. The caches
    (n, positions, heads, d) enter as transposed views: copying them would cost more than
    the attention itself."""
    if q.shape[0] == 0:  # an empty DP group: nothing to attend; keeps fused kernels off 0-size batches
        return q.clone()
    positions = torch.arange(k_cache.shape[1], device=q.device)
    visible = positions[None, :] <= lengths[:, None]  # (n, positions)
    out = F.scaled_dot_product_attention(q.unsqueeze(2), k_cache.transpose(1, 2),
                                         v_cache.transpose(1, 2), attn_mask=visible[:, None, None, :])
    return out.squeeze(2)


def attention(x: torch.Tensor, w: LayerWeights, k_cache: torch.Tensor, v_cache: torch.Tensor,
              lengths: torch.Tensor, head_dim: int) -> torch.Tensor:
    """This share's heads: QKV projection, attention, and their rows of o_proj.
    Row-parallel o_proj makes the result partial over the shares of the heads."""
    n, heads = x.shape[0], w.o.shape[0] // head_dim
    q, k, v = (x @ w.qkv).view(n, 3, heads, head_dim).unbind(1)
    write_kv(k_cache, v_cache, lengths, k, v)
    out = cached_attention(q, k_cache, v_cache, lengths)
    return out.reshape(n, heads * head_dim) @ w.o


# -- MoE ----------------------------------------------------------------------------------
def route(x: torch.Tensor, router: torch.Tensor, top_k: int,
          offsets: torch.Tensor | None = None) -> torch.Tensor:
    """Dense fp32 gates (tokens, experts). The chosen experts are the top_k of the router
    logits + `offsets` (fp32 (tokens, experts), the routing margin: see
    ModelConfig.route_margin and `route_offsets`); their gates are the softmax over
    their raw logits, without the offsets, and 0 elsewhere. Without offsets (or all-zero
    ones) this is the plain top-k router: the renormalised top-k softmax."""
    logits = (x @ router).float()
    scores = logits if offsets is None else logits + offsets
    chosen = scores.topk(top_k, dim=-1).indices
    return torch.zeros_like(logits).scatter_(1, chosen, torch.softmax(logits.gather(1, chosen), dim=-1))


def expert_mlp(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """SwiGLU of a stack of experts (or intermediate slices of them) on every token:
    x (tokens, hidden) -> (experts, tokens, hidden). A slice of the intermediate dim
    gives that slice's partial sum, because the down projection sums over it."""
    return (F.silu(x @ gate) * (x @ up)) @ down


def moe(x: torch.Tensor, gates: torch.Tensor, w: LayerWeights) -> torch.Tensor:
    """This share's experts, densely over all tokens (a token not routed to an expert has
    gate 0 there), weighted and summed in fp32. Partial over the shares of experts and
    intermediate slices."""
    local = gates[:, w.first_expert : w.first_expert + w.gate.shape[0]]
    y = expert_mlp(x, w.gate, w.up, w.down).float()
    return torch.einsum("te,eth->th", local, y).to(x.dtype)


# -- the layer ----------------------------------------------------------------------------
class CommTransitions:
    """Where a rank's partial sums meet: the Communicator's token transitions."""

    def __init__(self, comm: Communicator, dp_sizes):
        self.comm, self.dp_sizes = comm, dp_sizes

    def gather(self, o_partial, residual, norm_weight, eps):
        return self.comm.gather_tokens(o_partial, self.dp_sizes, partial=True, residual=residual,
                                       norm_weight=norm_weight, eps=eps)

    def scatter(self, y_partial):
        if self.comm.layout.attn_dp == 1:
            # No DP: the one group owns every token, so this is a plain all-reduce.
            return self.comm.all_reduce(y_partial)
        return self.comm.scatter_tokens(y_partial, self.dp_sizes)


def decoder_layer(h: torch.Tensor, w: LayerWeights, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  lengths: torch.Tensor, cfg: ModelConfig, transitions,
                  offsets: torch.Tensor) -> torch.Tensor:
    """h: this DP group's rows -> the same rows after one layer.

    transitions.gather(o_partial, residual, norm_weight, eps) -> (normed rows of every DP
    group, residual rows of this group): the only place the post-attention residual add
    and norm happen. transitions.scatter(y_partial) -> this group's reduced rows.
    offsets: the routing offsets of every gathered row (`route_offsets`).
    """
    o_partial = attention(rms_norm(h, w.input_norm, cfg.eps), w, k_cache, v_cache, lengths, cfg.head_dim)
    normed_all, residual = transitions.gather(o_partial, h, w.post_attn_norm, cfg.eps)
    y_partial = moe(normed_all, route(normed_all, w.router, cfg.top_k, offsets), w)
    return residual + transitions.scatter(y_partial)


def decode_step(weights: ModelWeights, part: DpBatch, transitions, offsets: torch.Tensor) -> torch.Tensor:
    """Every layer on `part` (its caches get this step's k, v); returns the final rows.
    offsets: routing offsets of all the MoE's rows (every DP group's), the same in
    every layer."""
    h = part.hidden
    for layer, w in enumerate(weights.layers):
        h = decoder_layer(h, w, part.k_cache[layer], part.v_cache[layer], part.lengths,
                          weights.cfg, transitions, offsets)
    return h


class DistributedDecoder:
    """This rank's slice of the model, run through a Communicator.

    weights: the full model (every rank builds the same from the seed); the decoder
    keeps only this rank's heads, experts and intermediate slices.
    """

    def __init__(self, cfg: ModelConfig, weights: ModelWeights, comm: Communicator):
        self.cfg, self.comm = cfg, comm
        self.shard = Shard.for_rank(cfg, comm.layout, comm.rank)
        self.weights = weights.shard(self.shard)
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
        return decode_step(self.weights, part, CommTransitions(self.comm, dp_sizes),
                           self.route_offsets(dp_sizes, part.hidden.device))

    __call__ = forward
