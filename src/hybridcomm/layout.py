"""Which rank is which: the parallel layout of attention and MoE over one world of GPUs.

Pure Python, no torch.distributed. The rank numbering is a contract (docs/architecture.md, "Ranks"):

    rank = attn_dp_rank * attn_tp + attn_tp_rank    (attention TP varies fastest)
    rank = moe_ep_rank  * moe_tp  + moe_tp_rank     (MoE TP varies fastest)
    node = rank // ranks_per_node                   (None: one node)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GROUP_NAMES = ("world", "attn_tp", "attn_dp", "moe_tp", "moe_ep")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


LAYOUT_KEYWORDS = {"world": "world_size", "attn_tp": "attn_tp", "moe_tp": "moe_tp"}


def _parse_keywords(text: str) -> dict[str, int]:
    """'world=6,attn_tp=3,moe_tp=2' -> Layout keyword arguments."""
    values: dict[str, int] = {}
    for item in text.split(","):
        key, _, value = item.strip().partition("=")
        if key not in LAYOUT_KEYWORDS:
            raise ValueError(f"cannot parse layout {text!r}: unknown key {key!r}; valid keys are "
                             f"{list(LAYOUT_KEYWORDS)}, e.g. 'world=6,attn_tp=3,moe_tp=2'")
        if not value.strip().isdigit():
            raise ValueError(f"cannot parse layout {text!r}: {key} needs a positive integer, got {value!r}")
        values[LAYOUT_KEYWORDS[key]] = int(value)
    if "world_size" not in values:
        raise ValueError(f"cannot parse layout {text!r}: 'world=N' is required in the key=value form")
    return values


@dataclass(frozen=True)
class RankCoords:
    """Where one rank sits on every axis of the layout."""

    rank: int
    attn_dp_rank: int
    attn_tp_rank: int
    moe_ep_rank: int
    moe_tp_rank: int
    node: int


@dataclass(frozen=True)
class Layout:
    world_size: int
    attn_tp: int = 1
    moe_tp: int = 1
    ranks_per_node: int | None = None

    def __post_init__(self) -> None:
        for name in ("world_size", "attn_tp", "moe_tp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Layout: {name} must be a positive int, got {value!r}")
        w = self.world_size
        valid = _divisors(w)
        if w % self.attn_tp:
            raise ValueError(
                f"Layout: attn_tp={self.attn_tp} does not divide world_size={w}; "
                f"valid attn_tp values are {valid}"
            )
        if w % self.moe_tp:
            raise ValueError(
                f"Layout: moe_tp={self.moe_tp} does not divide world_size={w}; "
                f"valid moe_tp values are {valid}"
            )
        rpn = self.ranks_per_node
        if rpn is not None:
            if isinstance(rpn, bool) or not isinstance(rpn, int) or rpn < 1:
                raise ValueError(f"Layout: ranks_per_node must be a positive int or None, got {rpn!r}")
            if w % rpn:
                raise ValueError(
                    f"Layout: ranks_per_node={rpn} does not divide world_size={w}; "
                    f"valid values are {valid} (or None for one node)"
                )

    # -- derived sizes --------------------------------------------------------------------
    @property
    def attn_dp(self) -> int:
        return self.world_size // self.attn_tp

    @property
    def moe_ep(self) -> int:
        return self.world_size // self.moe_tp

    @property
    def num_nodes(self) -> int:
        return 1 if self.ranks_per_node is None else self.world_size // self.ranks_per_node

    # -- ranks ----------------------------------------------------------------------------
    def _check_rank(self, rank: int) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValueError(f"Layout: rank must be an int in [0, {self.world_size}), got {rank!r}")

    def coords(self, rank: int) -> RankCoords:
        self._check_rank(rank)
        return RankCoords(
            rank=rank,
            attn_dp_rank=rank // self.attn_tp,
            attn_tp_rank=rank % self.attn_tp,
            moe_ep_rank=rank // self.moe_tp,
            moe_tp_rank=rank % self.moe_tp,
            node=0 if self.ranks_per_node is None else rank // self.ranks_per_node,
        )

    def group_ranks(self, name: str, rank: int) -> tuple[int, ...]:
        """The ranks of `rank`'s group on axis `name`, in group order."""
        self._check_rank(rank)
        if name == "world":
            return tuple(range(self.world_size))
        if name in ("attn_tp", "moe_tp"):
            tp = self.attn_tp if name == "attn_tp" else self.moe_tp
            first = rank - rank % tp
            return tuple(range(first, first + tp))
        if name in ("attn_dp", "moe_ep"):
            tp = self.attn_tp if name == "attn_dp" else self.moe_tp
            return tuple(range(rank % tp, self.world_size, tp))
        raise ValueError(f"unknown group name {name!r}; valid names are {list(GROUP_NAMES)}")

    def groups(self, name: str) -> list[tuple[int, ...]]:
        """Every group on axis `name`, ordered by their first rank (same list on every rank)."""
        seen: dict[tuple[int, ...], None] = {}
        for r in range(self.world_size):
            seen.setdefault(self.group_ranks(name, r), None)
        return sorted(seen)

    def spans_nodes(self, ranks: tuple[int, ...]) -> bool:
        return len({self.coords(r).node for r in ranks}) > 1

    # -- naming -----------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """Short name as used on the command line: dp4, dp2xtp2, tp4 (+ ',moe_tp2' if set)."""
        return self.attention_name + (f",moe_tp{self.moe_tp}" if self.moe_tp > 1 else "")

    @property
    def attention_name(self) -> str:
        """The attention part of the name (dp4, dp2xtp2, tp4): what the token transitions move
        depends on it alone (selection tables key rules by it: algorithms.py)."""
        if self.attn_dp == 1 and self.attn_tp > 1:
            return f"tp{self.attn_tp}"
        if self.attn_tp == 1:
            return f"dp{self.attn_dp}"
        return f"dp{self.attn_dp}xtp{self.attn_tp}"

    @classmethod
    def parse(cls, text: str, ranks_per_node: int | None = None) -> "Layout":
        """A layout from its command-line name.

        Shorthand: 'dp4', 'dp2xtp2', 'tp4', optionally followed by ',moe_tp2' (world =
        dp x tp). Any world: 'world=6,attn_tp=3,moe_tp=2' (attn_tp and moe_tp default to 1).
        Raises ValueError saying what is wrong."""
        if not isinstance(text, str):
            raise ValueError(f"layout: expected a string such as 'dp2xtp2', got {type(text).__name__}")
        if "=" in text:
            return cls(**_parse_keywords(text), ranks_per_node=ranks_per_node)
        m = re.fullmatch(r"\s*(?:dp(\d+))?(?:x?tp(\d+))?(?:,moe_tp(\d+))?\s*", text)
        if not m or not (m.group(1) or m.group(2)):
            raise ValueError(
                f"cannot parse layout {text!r}; expected e.g. 'dp4', 'dp2xtp2', 'tp4', 'dp2xtp2,moe_tp2' "
                f"or 'world=6,attn_tp=3,moe_tp=2'"
            )
        dp = int(m.group(1) or 1)
        tp = int(m.group(2) or 1)
        return cls(dp * tp, attn_tp=tp, moe_tp=int(m.group(3) or 1), ranks_per_node=ranks_per_node)

    @classmethod
    def all_for_world(cls, world_size: int) -> list["Layout"]:
        """Every (attn_tp, moe_tp) layout of a single-node world."""
        return [
            cls(world_size, attn_tp=a, moe_tp=m)
            for a in _divisors(world_size)
            for m in _divisors(world_size)
        ]

    def rank_table(self) -> str:
        """A plain-text table: one line per rank with its coordinates."""
        lines = [f"layout {self.name}: world {self.world_size} = attn_dp {self.attn_dp} x attn_tp "
                 f"{self.attn_tp} = moe_ep {self.moe_ep} x moe_tp {self.moe_tp}, nodes {self.num_nodes}",
                 "rank  attn_dp  attn_tp  moe_ep  moe_tp  node"]
        for r in range(self.world_size):
            c = self.coords(r)
            lines.append(f"{r:>4}  {c.attn_dp_rank:>7}  {c.attn_tp_rank:>7}  {c.moe_ep_rank:>6}  "
                         f"{c.moe_tp_rank:>6}  {c.node:>4}")
        return "\n".join(lines)
