"""Which backend and algorithm runs an op: a table, not a chain of predicates.

For each op the table lists rules in increasing message size; the first rule whose
`max_bytes` is at least the message size wins. "Message size" is the tensor
ops.OPS names as the op's message: the input of all_reduce / reduce_scatter_v /
scatter_tokens, the output of all_gather_v / gather_tokens. With device-side sizes the
capacity is used, so a graph captured at the maximum size keeps the algorithm it was
captured with. Algorithm names are those of ops.OPS (the test checks every rule).

The nvlink rules apply only where the group can run our kernels (CUDA, one node, peer
access, rows a multiple of 16 bytes, per-peer data within the workspace); otherwise the
op goes to NCCL and the reason is logged at DEBUG level on logger "hybridcomm".

Thresholds come from `hybridcomm bench ops` / `bench transitions` on 4x H200
(results/): the size where the next algorithm starts winning. `hybridcomm tune` derives a
table from such results as data (tune.py, table_file.py; tables/4xH200.json is its reading of
the same run, README says where it differs from this one); `Communicator(table="4xH200")` or
a file's path loads one.

The token transitions (the ops on the world, ops.OpSpec.on_world) may also have rules for one
layout: key "<op>@<layout>", the layout's attention part (Layout.attention_name: "gather_tokens@tp4").
A call on that layout reads them instead of the op's own, which hold for every other layout. What
a transition moves, and so which algorithm is fastest at a message size, depends on how attention
splits the world: at 2 MiB two_step wins TP4's scatter and Lamport DP2xTP2's (TABLE below).

Groups that span nodes use the table of their node count (TABLES: the entry with the largest
node count not above the group's): hierarchical algorithms (backends/hierarchical.py) whose
legs inside a node are the communicator's own ops on the group's node part (so they go
through TABLE again) and whose legs across nodes run on the group's rails. The thresholds
there come from the cost model (costmodel.py) until measured on real nodes.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable

from . import ops

log = logging.getLogger("hybridcomm")

KiB, MiB = 1 << 10, 1 << 20


@dataclass(frozen=True)
class Rule:
    max_bytes: int | None  # inclusive; None = unbounded
    backend: str  # "nvlink" | "nccl"
    algorithm: str


LAYOUT_SEPARATOR = "@"


def layout_key(op: str, layout: str) -> str:
    """The table key of `op`'s rules for one layout (its attention name: "dp2xtp2")."""
    return f"{op}{LAYOUT_SEPARATOR}{layout}"


def rules_key(table: dict, op: str, layout: str | None) -> str:
    """The key `op`'s calls on `layout` read in `table`: the layout's own where the table has
    them, else the op's (layout None: the op's)."""
    own = None if layout is None else layout_key(op, layout)
    return own if own in table else op


def key_op(key: str) -> str:
    """The op a table key holds rules for ("gather_tokens@tp4" -> "gather_tokens")."""
    return key.partition(LAYOUT_SEPARATOR)[0]


def with_rules(table: dict[str, tuple[Rule, ...]], new: dict[str, tuple[Rule, ...]]) -> dict[str, tuple[Rule, ...]]:
    """`table` with every op of `new` ruled by `new` alone: the op's old rules go, its rules for
    single layouts included (else those would still win on their layouts)."""
    replaced = {key_op(key) for key in new}
    return {**{key: rules for key, rules in table.items() if key_op(key) not in replaced}, **new}


LAMPORT = "one_shot_lamport"  # the one-shot on the Lamport protocol (half LL's bytes, no flags)

TABLE: dict[str, tuple[Rule, ...]] = {
    # The unquantized ops' rules are those `hybridcomm tune` derived from the 4x H200 run of
    # 2026-11-22 23:20 (results/4xH200/{ops,transitions}_4xH200.*; packaged as tables/4xH200.json,
    # and tests/test_tune.py checks that they agree): per size the fastest algorithm, ties within
    # 5% going to the simpler one. In that run the LL one-shot all_reduce took 3.28 us at 2 KB and
    # tied Lamport at 128 KB; Lamport (16-byte payload stores) wins the row ops from 2 KB except
    # reduce_scatter_v at 32-256 KB, and the transitions from 64-256 KB to 16 MB (DP4 at 512
    # tokens/rank: 56.1 us against NCCL's 71.8, which the earlier 8 MB rule chose).
    "all_reduce": (
        Rule(32 * KiB, "nvlink", "one_shot"),
        Rule(2 * MiB, "nvlink", LAMPORT),
        Rule(8 * MiB, "nvlink", "two_shot_bulk"),
        Rule(None, "nccl", "nccl"),
    ),
    "all_gather_v": (
        Rule(16 * MiB, "nvlink", LAMPORT),
        Rule(None, "nccl", "nccl"),
    ),
    "reduce_scatter_v": (
        Rule(8 * KiB, "nvlink", LAMPORT),
        Rule(256 * KiB, "nvlink", "one_shot"),
        Rule(16 * MiB, "nvlink", LAMPORT),
        Rule(None, "nccl", "nccl"),
    ),
    # Message = the gathered output. two_step (two_step.py): reduce_scatter_v over attn-TP, then
    # all_gather_v over the world, each on the kernel its own rule picks -- the composition the
    # 23:20 run timed as "hc_unfused" (tune reads that column as two_step). Per size, the geometric
    # mean over the layouts measured there (bench transitions: 8 KiB per token, so 2 MiB is TP4
    # at 256 tokens/rank, DP2xTP2 at 128, DP4 at 64). From 2 MiB it wins where attn_tp > 1 (TP4
    # 256: 23.3 vs Lamport 27.3 us; 4 MiB: TP4 512 31.9 vs 50.6, DP2xTP2 256 26.9 vs 30.4; 8 MiB:
    # DP2xTP2 512 42.9 vs 55.3).
    "gather_tokens": (
        Rule(64 * KiB, "nvlink", "one_shot"),
        Rule(1 * MiB, "nvlink", LAMPORT),
        Rule(16 * MiB, "nvlink", "two_step"),
        Rule(None, "nccl", "nccl"),
    ),
    # Where those rules lose on one layout (by more than 5%), its own: DP2xTP2 at 128 tokens/rank
    # (2 MiB) takes 20.5 us on two_step against Lamport's 19.4. DP4 (attn_tp = 1) runs
    # all_gather_v's kernels, where Lamport wins from 1 token/rank (32 KiB: 7.2 vs LL's 7.6) and
    # two_step runs that same kernel (tune reads one timing for both: tune.same_kernel_times).
    layout_key("gather_tokens", "dp2xtp2"): (
        Rule(128 * KiB, "nvlink", "one_shot"),
        Rule(2 * MiB, "nvlink", LAMPORT),
        Rule(16 * MiB, "nvlink", "two_step"),
        Rule(None, "nccl", "nccl"),
    ),
    layout_key("gather_tokens", "dp4"): (
        Rule(16 * MiB, "nvlink", LAMPORT),
        Rule(None, "nccl", "nccl"),
    ),
    "gather_tokens_norm": (  # gather_tokens with residual + RMSNorm fused
        Rule(16 * MiB, "nvlink", "fused"),
        Rule(None, "nccl", "nccl"),
    ),
    # Quantized gathers (hybridcomm.quant, csrc/quant_gather.cu); message = the gathered bytes
    # (data + scales). results/4xH200/quant_4xH200.md (23:20 run; hidden 4096 and 7168, DP4 and
    # DP2xTP2, 1-1024 tokens per DP rank): the kernel (hc_quant) beat the NCCL path (nccl_q /
    # nccl_symm_q: quantize, all-gather data and scales -- what our NCCL backend runs) at every
    # point, up to the largest, 28.9 MiB (DP4, fp8_block128, hidden 7168, 1024 tokens/rank: 198.3
    # vs 209.3 us; fp8 there 206.4 vs 209.3: a tie). So the kernel runs to 32 MiB; above that it
    # is unmeasured (NCCL). Past the workspace (LL: half of workspace_bytes per peer, checked by
    # the backend) NCCL runs it at any size. Caveats: our NCCL backend quantizes with the torch
    # reference quantizer (many small kernels) -- the two all-gathers alone (nccl_ag_only) took
    # 93.6 us at that 28 MiB point -- and from ~1024 tokens/rank our LL kernel moves fp8 no faster
    # than our bf16 Lamport gather moves bf16 (206.4 vs 181.1 us). The same kernel on the Lamport
    # protocol (quant_lamport, csrc/lamport_quant_gather.cu: half the LL bytes, no flags), after
    # both kernels got register rows (2x H200, 2026-11-23 02:15, results/2xH200/quant_2xH200.md,
    # DP2 and TP2, hidden 4096 / 7168, 1-1024 tokens). Re-measured after the 32-bit index
    # divisions and the hardware e4m3 conversion (2x H200, 2026-11-23 03:25,
    # results/2xH200/quant_2xH200.md): LL wins everywhere to ~1.7 MiB (fp8 DP2 128 tokens 8.8 vs
    # 9.9 us) and nvfp4 DP2 to 4.5 MiB; Lamport wins DP2 fp8 from 1.75 MiB (4 MiB: 16.0 vs 20.0,
    # 7 MiB: 24.1 vs 32.0), TP2 is within 1-9% either way from 3.5 MiB. Of the single size limits,
    # LL to 3 MiB loses least over the 96 measured points (geometric mean 0.3%, worst 12%: DP2
    # nvfp4 4.5 MiB); the former 6 MiB lost 1.2% (worst 36%: DP2 fp8_block128 4 MiB). 4 GPUs: not
    # measured with the Lamport kernel. Where LL's workspace check blocks it (unquantized rows
    # over half an area per peer), choose() passes the call on to the Lamport rule.
    # gather_tokens' quant_one_hop (every attention-TP rank sums and quantizes its group's rows;
    # with attn_tp = 1 it runs quant's kernel path). TP2 (2x H200, 2026-11-23 04:59,
    # results/2xH200/quant_2xH200.md): it wins at 1 and 16 tokens in every format and hidden size
    # (fp8 h4096 16 tokens: 7.19 vs quant's 10.02 us; nvfp4 9.44 vs 12.13; fp8 h7168 10.21 vs
    # 12.01), fp8 h4096 64 tokens (262 KB: 10.49 vs 11.31) and loses from 128 (its partial rows
    # go to every tp peer on LL: 13.53 vs 13.11, 512: 39.2 vs 26.2) and nvfp4 h4096 at 64 tokens
    # (147 KB: 15.48 vs 13.94; the rule follows the quantized bytes, one hop costs by the
    # unquantized ones). To 128 KiB: the 256 KiB that run's "hybridcomm" column used lost that
    # nvfp4 point, and no measured point lies between the two for fp8. Not measured on 4 GPUs:
    # there its one hop is its own DP group's only (other groups' rows still take two on
    # DP2xTP2), and TP4 sends 3x the partial bytes.
    "all_gather_v_quant": (
        Rule(3 * MiB, "nvlink", "quant"),
        Rule(32 * MiB, "nvlink", "quant_lamport"),
        Rule(None, "nccl", "nccl"),
    ),
    "gather_tokens_quant": (
        Rule(128 * KiB, "nvlink", "quant_one_hop"),
        Rule(3 * MiB, "nvlink", "quant"),
        Rule(32 * MiB, "nvlink", "quant_lamport"),
        Rule(None, "nccl", "nccl"),
    ),
    # Message = the world-partial input (all tokens). two_step: reduce_scatter_v over the world,
    # then all_gather_v over attn-TP (the 23:20 run's "hc_unfused"), from 4 MiB (TP4 512: 32.8 vs
    # Lamport 53.9 us; DP2xTP2 256: 27.3 vs 29.2; 8 MiB: DP2xTP2 512 45.7 vs 54.3). At 2 MiB the
    # layouts disagree and the geometric mean keeps Lamport (17.8 vs 18.4 us): DP2xTP2 at 128
    # tokens/rank gains 4.7 us there (16.4 vs 21.1). DP4: the same Lamport reduce_scatter_v kernel
    # either way.
    "scatter_tokens": (
        Rule(128 * KiB, "nvlink", "one_shot"),
        Rule(2 * MiB, "nvlink", LAMPORT),
        Rule(16 * MiB, "nvlink", "two_step"),
        Rule(None, "nccl", "nccl"),
    ),
    # TP4 at 256 tokens/rank (2 MiB) would lose 4.4 us on Lamport (27.7 vs two_step's 23.3).
    layout_key("scatter_tokens", "tp4"): (
        Rule(128 * KiB, "nvlink", "one_shot"),
        Rule(1 * MiB, "nvlink", LAMPORT),
        Rule(16 * MiB, "nvlink", "two_step"),
        Rule(None, "nccl", "nccl"),
    ),
}


# Groups across nodes (backends/hierarchical.py). all_reduce one-shot: all-reduce in the node,
# then every rank gathers its rail's node sums (two legs, the whole message on the network from
# every GPU); two-shot: reduce-scatter in the node, all-reduce of 1/L on the rail, all-gather in
# the node. Gathers and scatters run their rail leg with each GPU's own rows only.
HIERARCHICAL_TABLE: dict[str, tuple[Rule, ...]] = {
    "all_reduce": (
        Rule(256 * KiB, "hierarchical", "one_shot"),
        Rule(None, "hierarchical", "two_shot"),
    ),
    **{op: (Rule(None, "hierarchical", "rail_first"),)
       for op in ("all_gather_v", "reduce_scatter_v", "gather_tokens", "gather_tokens_norm", "scatter_tokens")},
}

# What runs across nodes by default: the cost model's choice for 2 and 4 x 8 H200 at 400 Gb/s
# (README "Across nodes"; to be replaced by measurements on real nodes). Each hierarchical leg
# over the network is a host-launched NCCL collective with NCCL's fixed cost, so our legs win
# where they replace NCCL collectives by our kernels: all_reduce to ~128 KB, and the transitions,
# composed of sub-ops that choose again by this table (attn_tp > 1: gather to 128 tokens per
# DP group of DP8xTP2, 8 MB gathered; scatter to 1024, 64 MB). Flat NCCL keeps the rest: its
# rings already send each GPU's share over its rail and pipeline the legs. Device-side sizes
# always take the hierarchical path (NCCL cannot read them).
SPANNING_TABLE: dict[str, tuple[Rule, ...]] = {
    "all_reduce": (
        Rule(128 * KiB, "hierarchical", "one_shot"),
        Rule(None, "nccl", "nccl"),
    ),
    "all_gather_v": (Rule(None, "nccl", "nccl"),),
    "reduce_scatter_v": (Rule(None, "nccl", "nccl"),),
    "gather_tokens": (Rule(8 * MiB, "hierarchical", "rail_first"), Rule(None, "nccl", "nccl")),
    "gather_tokens_norm": (Rule(8 * MiB, "hierarchical", "rail_first"), Rule(None, "nccl", "nccl")),
    "scatter_tokens": (Rule(64 * MiB, "hierarchical", "rail_first"), Rule(None, "nccl", "nccl")),
}

# Node count -> table; a group uses the entry with the largest node count <= its own.
TABLES: dict[int, dict[str, tuple[Rule, ...]]] = {1: TABLE, 2: SPANNING_TABLE}


def node_tables(table: dict | str | os.PathLike | None) -> dict[int, dict[str, tuple[Rule, ...]]]:
    """A Communicator's `table` argument as node count -> table: a table keyed by op replaces
    the single-node one; one keyed by node count is taken as it is; a string or path names
    NAMED_TABLES' entry, a packaged table or a table file (table_file.py)."""
    if table is None:
        return dict(TABLES)
    if isinstance(table, (str, os.PathLike)):
        from .table_file import load

        table = NAMED_TABLES[table] if table in NAMED_TABLES else load(table)
    if all(isinstance(k, int) for k in table):
        return dict(table)
    return {**TABLES, 1: table}


def picks_protocol(tables: dict[int, dict[str, tuple[Rule, ...]]], protocol) -> bool:
    """Whether any rule of these tables (node count -> table) names an algorithm on `protocol`
    (ops.Protocol): the workspace holds a protocol's areas only where one can run."""
    return any(rule.backend == "nvlink" and rule.algorithm is not None
               and ops.OPS[key_op(key)].algorithm(rule.algorithm).protocol is protocol
               for table in tables.values() for key, rules in table.items() for rule in rules)


def table_for_nodes(nodes: int, tables: dict[int, dict[str, tuple[Rule, ...]]] = TABLES) -> dict[str, tuple[Rule, ...]]:
    return tables[max(k for k in tables if k <= nodes)]


def choose_across_nodes(op: str, message_bytes: int, nodes: int, device_sizes: bool,
                        tables: dict[int, dict[str, tuple[Rule, ...]]] = TABLES) -> "Choice":
    """The rule for a group over `nodes` nodes; NCCL rules give way to the hierarchical path
    when the sizes live on the device."""
    rule = rule_at(table_for_nodes(nodes, tables)[op], message_bytes)
    if rule.backend == "nccl" and device_sizes and op != "all_reduce":
        choice = Choice("hierarchical", "rail_first", "device-side sizes: NCCL needs counts on the host")
    else:
        choice = Choice(rule.backend, rule.algorithm, f"table for {nodes} nodes")
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s %d bytes over %d nodes -> %s/%s (%s)", op, message_bytes, nodes, choice.backend,
                  choice.algorithm, choice.reason)
    return choice


def rule_at(rules: tuple[Rule, ...], message_bytes: int) -> Rule:
    """The first rule whose max_bytes holds the message (the last one otherwise)."""
    for rule in rules:
        if rule.max_bytes is None or message_bytes <= rule.max_bytes:
            break
    return rule


@dataclass(frozen=True)
class Choice:
    backend: str
    algorithm: str | None
    reason: str


def choose(op: str, message_bytes: int, nvlink_blocker: Callable[[str], str | None],
           table: dict[str, tuple[Rule, ...]] = TABLE, layout: str | None = None) -> Choice:
    """nvlink_blocker(algorithm): why our kernel cannot run this call (None if it can); layout:
    the communicator's attention name, where the op is a transition (the module docstring).

    The first rule whose max_bytes holds the message; if our kernel cannot run it (a row width,
    a dtype, the workspace), the call passes on to the next rules, which are for larger
    messages, so they run it too (e.g. the quantized gather's LL kernel needs its unquantized
    rows in half an area, the Lamport kernel in a whole one), and to NCCL when none can."""
    key = rules_key(table, op, layout)
    rules = table[key]
    first = rules.index(rule_at(rules, message_bytes))
    blocked = []  # (algorithm, why) of the rules our kernels could not run
    for rule in rules[first:]:
        why = nvlink_blocker(rule.algorithm) if rule.backend == "nvlink" else None
        if why is None:
            break
        blocked.append((rule.algorithm, why))
    if blocked and (why is not None or rule.backend != "nvlink"):  # no kernel of ours left: NCCL
        choice = Choice("nccl", "nccl", blocked[0][1])
    else:
        limit = "any size" if rule.max_bytes is None else f"<= {rule.max_bytes} bytes"
        passed = "".join(f"; {a} blocked: {w}" for a, w in blocked)
        whose = f" for {layout}" if key != op else ""
        choice = Choice(rule.backend, rule.algorithm, f"table rule {limit}{whose}{passed}")
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s %d bytes -> %s/%s (%s)", op, message_bytes, choice.backend,
                  choice.algorithm, choice.reason)
    return choice


def forced(algorithms: dict[str, str], table: dict[str, tuple[Rule, ...]] = TABLE) -> dict[str, tuple[Rule, ...]]:
    """A table that runs op -> algorithm on our kernels at every size (tests and benchmarks:
    `Communicator(layout, table=forced({"all_reduce": "two_shot"}))`)."""
    return with_rules(table, {op: (Rule(None, "nvlink", algorithm),) for op, algorithm in algorithms.items()})


# Every algorithm of a kind forced on every op that has one (tests and `hybridcomm check`).
NAMED_TABLES = {
    "auto": TABLE,
    "one_shot": forced(ops.algorithms_where(lambda a: a.name == "one_shot")),
    "two_shot": forced(ops.algorithms_where(lambda a: a.name == "two_shot")),
    "bulk": forced(ops.algorithms_where(lambda a: a.protocol is ops.BULK)),
    "lamport": forced(ops.algorithms_where(lambda a: a.protocol is ops.LAMPORT)),
    "two_step": forced(ops.algorithms_where(lambda a: a.name == "two_step")),  # the transitions composed
    "quant_ll": forced(ops.algorithms_where(lambda a: a.name == "quant")),  # the quantized gathers on LL
    "quant_one_hop": forced(ops.algorithms_where(lambda a: a.name == "quant_one_hop")),  # ... every tp rank sums
    "quant_local": forced(ops.algorithms_where(lambda a: a.name == "quant_local")),  # ... every rank, where rows land
    "pipelined": forced(ops.algorithms_where(lambda a: a.protocol is ops.CHUNKED)),  # not in TABLE (4 GPUs)
    "hierarchical": {1: TABLE, 2: HIERARCHICAL_TABLE},  # across nodes: our path at every size
}
