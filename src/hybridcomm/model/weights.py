"""Deterministic model data from the config's seed: weights and decode batches.

Every tensor has its own generator, seeded from (seed, its name), so any process
rebuilds the same values without coordination, and a batch's DP groups can be built
one at a time. Values are drawn in fp32, then cast. Weights are drawn on the CPU
(the same on every machine); batches on their device, because a benchmark's KV caches
are gigabytes (so a batch's values depend on the device type, not on the rank).
Routing offsets (`route_offsets`) are drawn on the CPU, so every rank and the reference
get the same ones whatever the device.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field, replace

import torch

from .config import ModelConfig, Shard


def _generator(seed: int, name: str, device="cpu") -> torch.Generator:
    # crc32, not hash(): Python salts string hashes per process.
    return torch.Generator(device).manual_seed(zlib.crc32(f"{seed}/{name}".encode()))


def _normal(shape: tuple[int, ...], std: float, seed: int, name: str, device="cpu") -> torch.Tensor:
    return torch.randn(shape, generator=_generator(seed, name, device), device=device) * std


@dataclass
class LayerWeights:
    """One layer's weights, or one rank's slice of them (see `shard`).

    qkv columns are laid out [q | k | v] x heads x head_dim, so a head range is a
    column range of each of the three blocks; o rows are heads x head_dim.
    router_experts: (hidden, E * 2 * I + experts), the columns of every matmul that reads
    the MoE input, so one matmul gives them all: this share's E experts' gate and up
    projections, laid out E x [gate | up] x I (`gate_up`), then the router's columns of
    *every* expert (`router`). down: (E, I, hidden), stacked over this share's experts.
    `gate` / `up` are (E, hidden, I) views of gate_up. Build from separate tensors with
    `LayerWeights.build`.
    first_expert: the global index of this share's first expert (to pick its router gates).
    """

    input_norm: torch.Tensor
    qkv: torch.Tensor
    o: torch.Tensor
    post_attn_norm: torch.Tensor
    router_experts: torch.Tensor
    down: torch.Tensor
    first_expert: int = 0
    # input_norm in fp32, made once (not in every step): the norm's math is fp32.
    input_norm_f32: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.input_norm_f32 = self.input_norm.float()
        e, i, hidden = self.down.shape
        if self.router_experts.dim() != 2 or self.router_experts.shape[0] != hidden or \
                self.router_experts.shape[1] <= 2 * e * i:
            raise ValueError(f"LayerWeights: router_experts {tuple(self.router_experts.shape)} does not "
                             f"fit down {tuple(self.down.shape)}")

    @classmethod
    def build(cls, input_norm, qkv, o, post_attn_norm, router, gate, up, down,
              first_expert: int = 0) -> "LayerWeights":
        """From router (hidden, experts) and gate / up (E, hidden, I), down (E, I, hidden)."""
        gate_up = torch.stack([gate.permute(1, 0, 2), up.permute(1, 0, 2)], dim=2)  # (hidden, E, 2, I)
        router_experts = torch.cat([gate_up.reshape(gate_up.shape[0], -1), router], dim=1)
        return cls(input_norm, qkv, o, post_attn_norm, router_experts, down.contiguous(), first_expert)

    @property
    def expert_columns(self) -> int:
        """How many of router_experts' columns are the experts' (E * 2 * I)."""
        e, i, _ = self.down.shape
        return 2 * e * i

    @property
    def gate_up(self) -> torch.Tensor:
        """(hidden, E, 2, I) view: [:, e, 0] is expert e's gate projection, [:, e, 1] its up."""
        e, i, hidden = self.down.shape
        return self.router_experts[:, :self.expert_columns].view(hidden, e, 2, i)

    @property
    def router(self) -> torch.Tensor:
        """(hidden, experts) view: the router of every expert, not only this share's."""
        return self.router_experts[:, self.expert_columns:]

    @property
    def gate(self) -> torch.Tensor:
        return self.gate_up[:, :, 0].permute(1, 0, 2)

    @property
    def up(self) -> torch.Tensor:
        return self.gate_up[:, :, 1].permute(1, 0, 2)

    def shard(self, s: Shard, head_dim: int) -> "LayerWeights":
        hidden = self.qkv.shape[0]
        heads = self.qkv.view(hidden, 3, -1, head_dim)[:, :, s.head0:s.head1]
        o = self.o.view(-1, head_dim, hidden)[s.head0:s.head1]
        experts, inter = slice(s.expert0, s.expert1), slice(s.inter0, s.inter1)
        gate_up = self.gate_up[:, experts, :, inter]
        return replace(
            self,
            qkv=heads.reshape(hidden, -1).contiguous(),
            o=o.reshape(-1, hidden).contiguous(),
            router_experts=torch.cat([gate_up.reshape(hidden, -1), self.router], dim=1),
            down=self.down[experts, inter].contiguous(),
            first_expert=self.first_expert + s.expert0,
        )


def generate_layer(cfg: ModelConfig, layer: int, device) -> LayerWeights:
    """normal / sqrt(fan_in) keeps activations O(1) through the layers; norm weights
    near 1 (not exactly 1, so a wrong weight shows up in the result)."""
    h, q, e, i = cfg.hidden, cfg.heads * cfg.head_dim, cfg.experts, cfg.intermediate

    def make(name, shape, std, mean=0.0):
        t = _normal(shape, std, cfg.seed, f"layer{layer}/{name}") + mean
        return t.to(device=device, dtype=cfg.dtype)

    return LayerWeights.build(
        input_norm=make("input_norm", (h,), 0.1, mean=1.0),
        qkv=make("qkv", (h, 3 * q), h ** -0.5),
        o=make("o", (q, h), q ** -0.5),
        post_attn_norm=make("post_attn_norm", (h,), 0.1, mean=1.0),
        router=make("router", (h, e), h ** -0.5),
        gate=make("gate", (e, h, i), h ** -0.5),
        up=make("up", (e, h, i), h ** -0.5),
        down=make("down", (e, i, h), i ** -0.5),
    )


@dataclass
class ModelWeights:
    cfg: ModelConfig
    layers: list[LayerWeights]

    @classmethod
    def generate(cls, cfg: ModelConfig, device="cpu") -> "ModelWeights":
        return cls(cfg, [generate_layer(cfg, layer, device) for layer in range(cfg.layers)])

    def shard(self, s: Shard) -> "ModelWeights":
        return ModelWeights(self.cfg, [w.shard(s, self.cfg.head_dim) for w in self.layers])


@dataclass
class DpBatch:
    """One DP group's requests for one decode step (or one rank's heads of them).

    hidden: (n, hidden) states entering layer 0.
    k_cache, v_cache: (layers, n, max_cache, heads, head_dim); positions >= lengths hold
        garbage (random), as in a real paged cache, so masking mistakes show.
    lengths: (n,) int64 cached positions per request, in [1, max_cache - 1]; the step
        writes its token's k, v at position lengths and attends to 0..lengths inclusive.
    dp_index: which DP group these requests are; with the row, a token's identity
        for its routing offsets (`group_route_offsets`).
    """

    hidden: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    lengths: torch.Tensor
    dp_index: int = 0

    @property
    def rows(self) -> int:
        return self.hidden.shape[0]

    def heads(self, head0: int, head1: int) -> "DpBatch":
        """A copy holding only heads [head0, head1) of the caches."""
        return DpBatch(self.hidden.clone(), self.k_cache[..., head0:head1, :].clone(),
                       self.v_cache[..., head0:head1, :].clone(), self.lengths.clone(), self.dp_index)


def make_dp_batch(cfg: ModelConfig, rows: int, dp_index: int, device="cpu") -> DpBatch:
    """DP group `dp_index`'s part of `make_batch` (the same values, built alone)."""
    device = torch.device(device)
    name = f"batch/dp{dp_index}/rows{rows}"

    def make(what, shape):
        return _normal(shape, 1.0, cfg.seed, f"{name}/{what}", device).to(cfg.dtype)

    def make_cache(what):
        # Layer by layer, so the fp32 draw never holds more than one layer.
        cache = torch.empty((cfg.layers, rows, cfg.max_cache, cfg.heads, cfg.head_dim),
                            dtype=cfg.dtype, device=device)
        for layer in range(cfg.layers):
            cache[layer] = make(f"{what}{layer}", cache.shape[1:])
        return cache

    lengths = torch.randint(1, cfg.max_cache, (rows,), device=device,
                            generator=_generator(cfg.seed, f"{name}/lengths", device))
    return DpBatch(make("hidden", (rows, cfg.hidden)), make_cache("k"), make_cache("v"), lengths,
                   dp_index)


def group_route_offsets(cfg: ModelConfig, dp_index: int, rows: int) -> torch.Tensor:
    """Routing offsets (rows, experts) fp32 on the CPU of DP group `dp_index`'s tokens:
    route_margin on each token's preferred top_k experts, 0 elsewhere (all 0 when
    route_margin is 0). The preferred set is uniform over the k-subsets: the top_k of
    i.i.d. uniform keys. Row r's keys are the r-th draw of the group's generator, which
    fills rows in order, so a token's offsets depend on (seed, dp_index, r) only, not
    on how many rows the group has."""
    offsets = torch.zeros((rows, cfg.experts))
    if cfg.route_margin and rows:
        keys = torch.rand((rows, cfg.experts), generator=_generator(cfg.seed, f"route/dp{dp_index}"))
        offsets.scatter_(1, keys.topk(cfg.top_k, dim=-1).indices, float(cfg.route_margin))
    return offsets


def route_offsets(cfg: ModelConfig, dp_sizes, device="cpu") -> torch.Tensor:
    """Routing offsets of every token of a step, (sum(dp_sizes), experts) fp32 in DP-group
    order (the order of the MoE's gathered rows). Drawn on the CPU from (seed, dp_sizes)
    alone, so every rank builds all of them without communication; then moved to
    `device`. A host-side copy: build it before a CUDA graph capture, not inside."""
    parts = [group_route_offsets(cfg, d, int(n)) for d, n in enumerate(dp_sizes)]
    return torch.cat(parts).to(device)


@dataclass
class Batch:
    """A decode step of every DP group, in DP order."""

    groups: list[DpBatch]

    @property
    def dp_sizes(self) -> list[int]:
        return [g.rows for g in self.groups]


def make_batch(cfg: ModelConfig, dp_sizes: list[int], device="cpu") -> Batch:
    return Batch([make_dp_batch(cfg, n, d, device) for d, n in enumerate(dp_sizes)])


def rank_part(group: DpBatch, cfg: ModelConfig, layout, rank: int) -> DpBatch:
    """What `rank` holds of its DP group's batch: every request, its heads of the caches."""
    s = Shard.for_rank(cfg, layout, rank)
    return group.heads(s.head0, s.head1)


def cut_batch(batch: Batch, cfg: ModelConfig, layout, rank: int) -> DpBatch:
    """`rank`'s part of a full batch (a copy): its DP group's rows, its attention heads."""
    if len(batch.groups) != layout.attn_dp:
        raise ValueError(f"batch: has {len(batch.groups)} DP groups, layout {layout.name} has "
                         f"attn_dp={layout.attn_dp}")
    return rank_part(batch.groups[layout.coords(rank).attn_dp_rank], cfg, layout, rank)
