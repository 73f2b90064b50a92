"""Which part of every weight one rank holds.

- attention: the DP group runs its own sequences; its attn_tp ranks split the query heads
  into contiguous blocks and take the key/value heads those read (replicated when there are
  fewer KV heads than TP ranks); the output projection is cut by the same heads, so its
  result is a partial sum over attn-TP.
- routed experts: a contiguous block of experts per moe_ep rank, each expert's intermediate
  dimension cut over moe_tp.
- dense MLPs (shared experts, dense layers): the intermediate dimension cut over the whole
  world, so, like the experts, their output is a partial sum over the world.
- everything else (embeddings, norms, routers, low-rank MLA projections, lm_head) replicated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..layout import Layout
from .families import ONCE, Family, HeadSplit, head_width

HEAD_ATTRIBUTE_VALUES = {"num_key_value_groups": lambda q, kv: q // kv, "num_heads": lambda q, kv: q}


def block(total: int, parts: int, index: int, what: str) -> range:
    if total % parts:
        raise ValueError(f"{what}: {total} does not split evenly over {parts} ranks")
    size = total // parts
    return range(index * size, (index + 1) * size)


@dataclass(frozen=True)
class RankPlan:
    rank: int
    q_heads: range
    kv_heads: range
    experts: range
    expert_slice: range      # of one expert's intermediate dim (moe_tp)
    dense_fraction: tuple[int, int]  # (index, parts) of every dense MLP's intermediate dim
    attn_tp_rank: int

    @classmethod
    def make(cls, config, family: Family, layout: Layout, rank: int) -> "RankPlan":
        c = layout.coords(rank)
        q_total, kv_total = config.num_attention_heads, getattr(config, family.kv_heads)
        q = block(q_total, layout.attn_tp, c.attn_tp_rank, f"num_attention_heads over attn_tp={layout.attn_tp}")
        group = q_total // kv_total
        kv = range(q.start // group, (q.stop - 1) // group + 1)
        if len(q) % len(kv):
            raise ValueError(f"attention heads: {len(q)} query heads per TP rank do not share "
                             f"{len(kv)} key/value heads evenly (attn_tp={layout.attn_tp})")
        experts = block(getattr(config, family.experts_count), layout.moe_ep, c.moe_ep_rank,
                        f"{family.experts_count} over moe_ep={layout.moe_ep}")
        inter = block(getattr(config, family.expert_intermediate), layout.moe_tp, c.moe_tp_rank,
                      f"{family.expert_intermediate} over moe_tp={layout.moe_tp}")
        return cls(rank, q, kv, experts, inter, (rank, layout.world_size), c.attn_tp_rank)

    def head_attributes(self, family: Family) -> dict:
        return {name: HEAD_ATTRIBUTE_VALUES[name](len(self.q_heads), len(self.kv_heads))
                for name in family.head_attributes}


# -- how one parameter is cut ---------------------------------------------------------------
LAYER = r"model\.layers\.(\d+)\."


def rule_for(name: str, family: Family, is_moe_layer) -> tuple[str, object]:
    """('replicated' | 'heads' | 'once' | 'experts' | 'dense', detail) for a state-dict name."""
    m = re.match(LAYER + re.escape(family.attention) + r"\.(.+)$", name)
    if m and m.group(2) in family.attention_splits:
        split = family.attention_splits[m.group(2)]
        return ("once", None) if split == ONCE else ("heads", split)
    m = re.match(LAYER + re.escape(family.mlp) + r"\.(.+)$", name)
    if m:
        layer, rest = int(m.group(1)), m.group(2)
        gate, up, down = family.dense_projections
        dense_prefix = "" if not is_moe_layer(layer) else (
            family.shared_experts + "." if family.shared_experts else None)
        if is_moe_layer(layer) and rest in (f"{family.experts}.gate_up_proj", f"{family.experts}.down_proj"):
            return "experts", rest.rsplit(".", 1)[1]
        if dense_prefix is not None:
            for proj, dim in ((gate, 0), (up, 0), (down, 1)):
                if rest == f"{dense_prefix}{proj}.weight":
                    return "dense", dim
                if rest == f"{dense_prefix}{proj}.bias":
                    return ("dense", 0) if dim == 0 else ("once_world", None)
    return "replicated", None


def head_rows(plan: RankPlan, split: HeadSplit, config) -> range:
    heads = plan.q_heads if split.heads == "q" else plan.kv_heads
    width = head_width(config, split.width)
    return range(heads.start * width, heads.stop * width)


def cut(tensor, dim: int, rows: range):
    return tensor.narrow(dim, rows.start, len(rows))


def fraction(total: int, index: int, parts: int, what: str) -> range:
    return block(total, parts, index, what)
