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
(results/): the size where the next algorithm starts winning.
"""

from __future__ import annotations

import logging
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


LAMPORT = "one_shot_lamport"  # the one-shot on the Lamport protocol (half LL's bytes, no flags)

# The Lamport one-shot takes the LL one-shot's range everywhere (same hop, half the bytes on
# NVLink, twice the payload capacity); not yet measured against it: retune with `bench ops` /
# `bench transitions`, which time both (hc_one_shot, hc_one_shot_lamport).
TABLE: dict[str, tuple[Rule, ...]] = {
    # one-shot wins to 512 KB; LL two-shot ties the bulk one at 1 MB; NCCL from 8 MB.
    "all_reduce": (
        Rule(512 * KiB, "nvlink", LAMPORT),
        Rule(1 * MiB, "nvlink", "two_shot"),
        Rule(4 * MiB, "nvlink", "two_shot_bulk"),
        Rule(None, "nccl", "nccl"),
    ),
    "all_gather_v": (
        Rule(8 * MiB, "nvlink", LAMPORT),
        Rule(None, "nccl", "nccl"),
    ),
    "reduce_scatter_v": (
        Rule(4 * MiB, "nvlink", LAMPORT),
        Rule(None, "nccl", "nccl"),
    ),
    # Message = the gathered output; one-shot to 16 tokens per rank (DP2xTP2, hidden 4096).
    "gather_tokens": (
        Rule(256 * KiB, "nvlink", LAMPORT),
        Rule(8 * MiB, "nvlink", "two_shot"),
        Rule(None, "nccl", "nccl"),
    ),
    "gather_tokens_norm": (  # gather_tokens with residual + RMSNorm fused
        Rule(16 * MiB, "nvlink", "fused"),
        Rule(None, "nccl", "nccl"),
    ),
    # Quantized gathers (hybridcomm.quant, csrc/quant_gather.cu); message = the gathered bytes
    # (data + scales). Not yet measured: the limit is the all_gather_v one-shot's.
    "all_gather_v_quant": (
        Rule(8 * MiB, "nvlink", "quant"),
        Rule(None, "nccl", "nccl"),
    ),
    "gather_tokens_quant": (
        Rule(8 * MiB, "nvlink", "quant"),
        Rule(None, "nccl", "nccl"),
    ),
    # Message = the world-partial input (all tokens).
    "scatter_tokens": (
        Rule(512 * KiB, "nvlink", LAMPORT),
        Rule(4 * MiB, "nvlink", "two_shot"),
        Rule(None, "nccl", "nccl"),
    ),
}


@dataclass(frozen=True)
class Choice:
    backend: str
    algorithm: str | None
    reason: str


def choose(op: str, message_bytes: int, nvlink_blocker: Callable[[str], str | None],
           table: dict[str, tuple[Rule, ...]] = TABLE) -> Choice:
    """nvlink_blocker(algorithm): why our kernel cannot run this call (None if it can)."""
    for rule in table[op]:
        if rule.max_bytes is None or message_bytes <= rule.max_bytes:
            break
    blocker = nvlink_blocker(rule.algorithm) if rule.backend == "nvlink" else None
    if blocker is not None:
        choice = Choice("nccl", "nccl", blocker)
    else:
        limit = "any size" if rule.max_bytes is None else f"<= {rule.max_bytes} bytes"
        choice = Choice(rule.backend, rule.algorithm, f"table rule {limit}")
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s %d bytes -> %s/%s (%s)", op, message_bytes, choice.backend,
                  choice.algorithm, choice.reason)
    return choice


def forced(algorithms: dict[str, str], table: dict[str, tuple[Rule, ...]] = TABLE) -> dict[str, tuple[Rule, ...]]:
    """A table that runs op -> algorithm on our kernels at every size (tests and benchmarks:
    `Communicator(layout, table=forced({"all_reduce": "two_shot"}))`)."""
    return {op: (Rule(None, "nvlink", algorithms[op]),) if op in algorithms else rules
            for op, rules in table.items()}


# Every algorithm of a kind forced on every op that has one (tests and `hybridcomm check`).
NAMED_TABLES = {
    "auto": TABLE,
    "one_shot": forced(ops.algorithms_where(lambda a: a.name == "one_shot")),
    "two_shot": forced(ops.algorithms_where(lambda a: a.name == "two_shot")),
    "bulk": forced(ops.algorithms_where(lambda a: a.protocol is ops.BULK)),
    "lamport": forced(ops.algorithms_where(lambda a: a.protocol is ops.LAMPORT)),
}
