"""A transformers MoE causal LM on a Communicator's layout: DP attention x EP MoE.

Per decoder layer, on every rank:

    h = input_norm(x)                        this DP group's tokens, replicated on its TP ranks
    a = attention(h)                         this rank's heads: partial over attn-TP
    moe_in, x = gather_tokens(a, sizes, residual=x, norm_weight=post_attention_norm)
                                             every DP group's tokens, reduced, normed
    y = experts(moe_in) + shared(moe_in)     this rank's experts / slices: partial over the world
    x = x + scatter_tokens(y, sizes)         back to this DP group's tokens, reduced

The router runs replicated on every token; a token's routes to experts this rank does not own
go to the experts module's "skip" index. The attention, norm, router and expert modules are
the transformers model's own (with cut weights), so the arithmetic is the model's.

`compile()` runs a layer's two compute regions (input norm + attention; router + experts +
shared experts) through torch.compile for decode steps, the transitions between them left as
they are: transformers' modules spend ~100 small kernels a layer on them, which engines fuse
(scripts/model_profile.py measures what that costs).
"""

from __future__ import annotations

import torch

from ..counts import Counts
from .build import is_moe_layer, layers
from .families import Family
from .plan import RankPlan


def attention_mask(positions: torch.Tensor, length: int, dtype: torch.dtype) -> torch.Tensor:
    """(n, 1, q, length) additive mask: key position j visible to a query at position p iff j <= p."""
    keys = torch.arange(length, device=positions.device)
    hidden = keys[None, None, :] > positions[:, :, None]
    mask = torch.zeros(hidden.shape, dtype=dtype, device=positions.device)
    return mask.masked_fill_(hidden, torch.finfo(dtype).min)[:, None]


class ParallelCausalLM:
    """What `parallelize` returns. `forward(input_ids, positions, cache, sizes)` runs this DP
    group's sequences (n, q) and returns their logits (n, q, vocab).

    sizes: tokens per DP group this forward (n * q each), as a list, a `Counts` holding this
    group's own count (exchanged in the first layer's gather), or an int32 device tensor (then
    every rank passes the same capacity n, of which the leading sizes[d] // q sequences are real:
    the CUDA-graph path).
    """

    def __init__(self, model, comm, family: Family, plan: RankPlan):
        self.model, self.comm, self.family, self.plan = model, comm, family, plan
        self.config = model.config
        self.layers = list(layers(model))
        self.moe = [is_moe_layer(model, family, i) for i in range(len(self.layers))]
        self.first_expert, self.own_experts = plan.experts.start, len(plan.experts)
        self.compiled = None  # (attention region, MoE region) once compile() is called

    def compile(self, **options) -> "ParallelCausalLM":
        """Compile the layers' compute regions (torch.compile `options`, default dynamic=False:
        one compile per layer and bucket shape, done in the eager run before a graph capture).
        Used by decode forwards (one token a sequence) on a cache that already holds its
        buffers; prefills and a fresh cache's first forward (it allocates the buffers) run
        eagerly, so no compile happens inside a capture. Returns self."""
        options = {"dynamic": False, **options}
        self.compiled = (torch.compile(self._attention_region, **options), torch.compile(self._ffn, **options))
        _allow_recompiles(2 * DECODE_SHAPES * len(self.layers))
        return self

    @property
    def device(self) -> torch.device:
        return self.model.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.lm_head.weight.dtype

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache, sizes) -> torch.Tensor:
        n, q = input_ids.shape
        x = self.model.model.embed_tokens(input_ids).reshape(n * q, self.config.hidden_size)
        valid = mine = None
        if isinstance(sizes, torch.Tensor):  # device counts: rows past the real ones skip the experts
            valid = torch.arange(self.comm.layout.attn_dp * n * q, device=x.device) < sizes.sum()
            # This group's rows past its count come back from the transitions unspecified (any
            # bits, NaN included: README, device-side sizes). They are filler rows whose K/V go
            # to the cache's scratch position, which a later step's masked attention still
            # multiplies by 0: so they are zeroed after every layer, or NaN would leak.
            dp = self.comm.layout.coords(self.comm.rank).attn_dp_rank
            mine = (torch.arange(n * q, device=x.device) < sizes[dp])[:, None]
        elif not isinstance(sizes, Counts):
            sizes = list(sizes)
        regions = self._regions(q, cache)
        rotary = self._rotary(x, positions, cache)
        for i, layer in enumerate(self.layers):
            x = self._layer(i, layer, x, (n, q), rotary, cache, sizes, valid, regions)
            if mine is not None:
                x = torch.where(mine, x, 0.0)
        x = self.model.model.norm(x)
        return self.model.lm_head(x).reshape(n, q, self.config.vocab_size)

    __call__ = forward

    def _rotary(self, x, positions, cache):
        if positions.shape[0] == 0:
            return None
        cache.bind(positions)
        cos_sin = self.model.model.rotary_emb(x, positions)
        return cos_sin, attention_mask(positions, cache.positions, x.dtype)

    def _regions(self, q: int, cache):
        """The (attention, MoE) region functions of this forward: compiled ones for decode
        steps on an allocated cache (compile()), else the eager ones."""
        if self.compiled is not None and q == 1 and cache.buffers:
            return self.compiled
        return self._attention_region, self._ffn

    def _layer(self, i, layer, x, shape, rotary, cache, sizes, valid, regions):
        attention_region, ffn = regions
        f = self.family
        if rotary is None:  # no sequences in this DP group: nothing to attend
            a = torch.zeros_like(x)
        else:
            a = attention_region(layer, x, shape, rotary, cache)
        norm = getattr(layer, f.post_attention_norm)
        moe_in, residual = self.comm.gather_tokens(a, sizes, residual=x, norm_weight=norm.weight,
                                                   eps=norm.variance_epsilon)
        y = ffn(i, getattr(layer, f.mlp), moe_in, valid) if moe_in.shape[0] else torch.zeros_like(moe_in)
        return residual + self.comm.scatter_tokens(y, sizes)[: residual.shape[0]]

    def _attention_region(self, layer, x, shape, rotary, cache):
        """Input norm + attention of this DP group's rows: this rank's heads, partial over attn-TP."""
        h = getattr(layer, self.family.input_norm)(x)
        (cos_sin, mask), (n, q) = rotary, shape
        attention = getattr(layer, self.family.attention)
        out, _ = attention(hidden_states=h.reshape(n, q, -1), position_embeddings=cos_sin,
                           attention_mask=mask, past_key_values=cache)
        return out.reshape(n * q, -1).contiguous()

    def _ffn(self, i, mlp, x, valid):
        """This rank's share of the MLP / MoE output for all tokens (partial over the world)."""
        if not self.moe[i]:
            return mlp(x)  # a dense layer: intermediate dim cut over the world
        f = self.family
        _, weights, experts = getattr(mlp, f.router)(x)
        module = getattr(mlp, f.experts)
        local = experts - self.first_expert
        own = (local >= 0) & (local < self.own_experts)  # (module.num_experts may be more: build.py)
        if valid is not None:
            own &= valid[:, None]
        local = torch.where(own, local, module.num_experts)
        out = module(x, local, torch.where(own, weights, torch.zeros_like(weights)))
        if f.shared_experts:
            out = out + getattr(mlp, f.shared_experts)(x)
        return out


DECODE_SHAPES = 12  # bucket shapes a compiled region may see per layer (powers of two to 2048 slots)


def _allow_recompiles(needed: int) -> None:
    """torch.compile keeps at most `recompile_limit` versions of a function (8 by default), then
    runs it eagerly: each layer and bucket shape is a version of the same region (the layer's
    index is a constant in transformers' cache calls), so raise the limits to what is needed."""
    import torch._dynamo.config as dynamo

    dynamo.recompile_limit = max(dynamo.recompile_limit, needed)
    dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit, 2 * needed)
