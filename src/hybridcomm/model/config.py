"""Shape of the reference MoE decoder, and which part of it one rank computes."""

from __future__ import annotations

from dataclasses import dataclass

import math

import torch

from ..layout import Layout

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def dtype_from_name(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype: expected one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the reference decoder, its dtype, and the seed of its data.

    route_margin: every token gets a fixed *preferred* set of top_k experts, drawn
    uniformly from (seed, its DP group index, its row in the group) -- see
    `route_offsets` -- and the router adds route_margin to the logits of those experts
    (0 elsewhere) before its top-k. The gate values are the softmax over the *raw*
    logits of the chosen experts (without the offsets), so they still come from the
    activations; only the choice of experts is pinned. Why: in bf16 the ranks round
    partial sums where the single-process reference does not; over the layers that
    flips near-ties between a token's k-th and (k+1)-th logit, a flipped expert changes
    that token's output by O(1), and the layer bench's error column would measure
    tie-breaking instead of communication. The router logits have std ~1 (the router
    input is RMS-normed; measured max spread between a token's experts 5.2-6.5 over 512
    tokens), so the margin must exceed that spread by far: with 4, 1.5-3.4% of tokens
    per layer still left their preferred set (1024 tokens, tiny and bench shapes) and
    a bf16 dp2xtp2 run on CPU still flipped a token (max relative row error 0.8); with
    16, no token left it and no row flipped (measured). route_margin=0 gives the plain
    top-k router (offsets all zero).
    """

    hidden: int
    heads: int
    head_dim: int
    experts: int
    top_k: int
    intermediate: int  # per expert
    layers: int
    max_cache: int  # KV cache capacity per request, in positions
    eps: float = 1e-6
    dtype: torch.dtype = torch.float32
    seed: int = 0
    route_margin: float = 16.0

    def __post_init__(self) -> None:
        for name in ("hidden", "heads", "head_dim", "experts", "top_k", "intermediate", "layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ModelConfig.{name}: expected a positive int, got {value!r}")
        if self.top_k > self.experts:
            raise ValueError(f"ModelConfig.top_k={self.top_k} exceeds experts={self.experts}")
        # A decode step writes its token at position len and len >= 1, so capacity >= 2.
        if not isinstance(self.max_cache, int) or self.max_cache < 2:
            raise ValueError(f"ModelConfig.max_cache: expected an int >= 2, got {self.max_cache!r}")
        margin = self.route_margin
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not (
                math.isfinite(margin) and margin >= 0):
            raise ValueError(f"ModelConfig.route_margin: expected a finite number >= 0, got {margin!r}")
        if self.dtype not in DTYPES.values():
            raise ValueError(f"ModelConfig.dtype: expected one of {sorted(DTYPES)}, got {self.dtype}")

    @classmethod
    def tiny(cls, dtype: torch.dtype = torch.float32) -> "ModelConfig":
        """Small enough for CPU tests with 4 gloo ranks."""
        return cls(hidden=64, heads=4, head_dim=16, experts=8, top_k=2, intermediate=32,
                   layers=2, max_cache=16, dtype=dtype)

    @classmethod
    def bench(cls, dtype: torch.dtype = torch.bfloat16) -> "ModelConfig":
        """GPU layer benchmark. Not a real model: hidden 4096 makes the messages the size the
        targets are stated for, while few heads (8), a short cache and small experts keep the
        attention/MoE compute modest, so the communication is a visible share of the step --
        as in small-batch decode of a large model sharded over many GPUs. With 32 heads the
        QKV projection alone dominated the step (measured: ~0.9 ms/step on H200)."""
        return cls(hidden=4096, heads=8, head_dim=128, experts=8, top_k=2, intermediate=1024,
                   layers=4, max_cache=256, dtype=dtype)

    @classmethod
    def named(cls, name: str, dtype: torch.dtype | None = None) -> "ModelConfig":
        """'tiny' or 'bench', in `dtype` (default: the preset's)."""
        presets = {"tiny": cls.tiny, "bench": cls.bench}
        if name not in presets:
            raise ValueError(f"config: expected one of {sorted(presets)}, got {name!r}")
        return presets[name]() if dtype is None else presets[name](dtype)

    def check_layout(self, layout: Layout) -> None:
        """Raise ValueError if the layout cannot split this model evenly."""
        cuts = (("heads", self.heads, "attn_tp", layout.attn_tp),
                ("experts", self.experts, "moe_ep", layout.moe_ep),
                ("intermediate", self.intermediate, "moe_tp", layout.moe_tp))
        for field, value, axis, parts in cuts:
            if value % parts:
                raise ValueError(f"ModelConfig.{field}={value} is not divisible by {axis}={parts} "
                                 f"of layout {layout.name} (world {layout.world_size}); pick a layout "
                                 f"whose {axis} divides {value}")

    def to_json(self) -> dict:
        return {**{k: getattr(self, k) for k in self.__dataclass_fields__}, "dtype": dtype_name(self.dtype)}


@dataclass(frozen=True)
class Shard:
    """The part of every layer one rank computes: heads [head0, head1), experts
    [expert0, expert1), intermediate columns [inter0, inter1) of each of those experts."""

    head0: int
    head1: int
    expert0: int
    expert1: int
    inter0: int
    inter1: int

    @classmethod
    def full(cls, cfg: ModelConfig) -> "Shard":
        return cls(0, cfg.heads, 0, cfg.experts, 0, cfg.intermediate)

    @classmethod
    def for_rank(cls, cfg: ModelConfig, layout: Layout, rank: int) -> "Shard":
        cfg.check_layout(layout)
        c = layout.coords(rank)
        heads = cfg.heads // layout.attn_tp
        experts = cfg.experts // layout.moe_ep
        inter = cfg.intermediate // layout.moe_tp
        return cls(c.attn_tp_rank * heads, (c.attn_tp_rank + 1) * heads,
                   c.moe_ep_rank * experts, (c.moe_ep_rank + 1) * experts,
                   c.moe_tp_rank * inter, (c.moe_tp_rank + 1) * inter)
