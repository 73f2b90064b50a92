"""The op registry: every fact about an op that more than one module needs, in one table.

Per op: its name, its C op code (abi.OpCode), which tensor is its "message" (the size the
selection table compares), whether the kernel sees it as one flat buffer or as rows, its
algorithms (each with its launcher code and wire protocol), and which op runs instead when
an axis of the layout has size 1. Selection (algorithms.py), the nvlink backend's capacity
check and dispatch, the error decoder, the benchmarks and the CLI read it.

Adding an algorithm or a protocol is adding data here (plus its kernel); adding an op is a
new OpSpec, its kernel file and its backends' methods: docs/architecture.md ("Adding an op").
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

from . import abi


@dataclass(frozen=True)
class Protocol:
    """How payload travels into a peer's receive area."""

    name: str
    unit_bytes: int  # payload bytes per unit (the granularity of a chunked split)
    wire_factor: int  # receive-area bytes per payload byte (LL: 2, flag beside the data; bulk: 1)

    def capacity(self, area_bytes: int) -> int:
        """Payload bytes one receive area holds (the C side: fits_area in abi.h)."""
        return area_bytes // self.wire_factor


LL = Protocol("LL", abi.LL_UNIT_BYTES, abi.LL_WIRE_FACTOR)
BULK = Protocol("bulk", abi.BULK_UNIT_BYTES, abi.BULK_WIRE_FACTOR)
# Payload is the flag (csrc/lamport.cuh): its own areas, of the same size, filled 1:1.
LAMPORT = Protocol("Lamport", abi.LAMPORT_UNIT_BYTES, abi.LAMPORT_WIRE_FACTOR)
# Full-width stores, one release flag per chunk (csrc/chunked.cuh): its own areas, of the same size.
CHUNKED = Protocol("chunked", abi.CHUNKED_UNIT_BYTES, abi.CHUNKED_WIRE_FACTOR)


@dataclass(frozen=True)
class Algorithm:
    name: str
    code: int | None  # the launcher's `algorithm` argument; None: the launcher has one kernel
    protocol: Protocol = LL
    # A flat message cut into one chunk per member (two-shot all_reduce): each peer gets 1/n.
    chunked: bool = False
    # A message beyond the workspace runs as several calls (the launcher cuts it): no size limit.
    sliced: bool = False
    # Its kernel takes this rank's own count alone (a `Counts` holding a device tensor) and
    # exchanges it inside the call, beside its arrival packet (csrc/own_count.cuh). Elsewhere
    # a Counts is exchanged before the op by a separate all-gather (counts.py).
    own_count: bool = False
    # No kernel of its own: two of the communicator's ops in sequence (two_step.py), each
    # choosing its kernel by the table; the composition's checks are the sub-ops'.
    composed: bool = False


@dataclass(frozen=True)
class OpSpec:
    name: str
    code: abi.OpCode
    message: str  # "input" | "output": the tensor whose bytes the selection table compares
    shape: str  # "flat": any tensor, as bytes | "rows": dim 0 is rows, counted by `sizes`
    algorithms: tuple[Algorithm, ...]
    # On the world group (token transitions) rather than a group the caller names.
    on_world: bool = False
    # Rows travel quantized (hybridcomm.quant): the quant= variant of another op.
    quantized: bool = False
    # Layout axis of size 1 -> the op that is exactly this op then (and runs instead).
    reduces_to: dict[str, str] = field(default_factory=dict)

    def algorithm(self, name: str) -> Algorithm:
        for a in self.algorithms:
            if a.name == name:
                return a
        raise KeyError(f"{self.name} has no algorithm {name!r}; it has {[a.name for a in self.algorithms]}")

    def per_peer_bytes(self, algorithm: Algorithm, nbytes: int, members: int) -> int:
        """Payload one source sends one peer in one phase: of a flat message of `nbytes`, or
        of rows (nbytes = the largest member's rows x row bytes)."""
        if not algorithm.chunked:
            return nbytes
        unit = algorithm.protocol.unit_bytes
        return math.ceil(nbytes / unit / members) * unit


ONE_SHOT = Algorithm("one_shot", None)
# Every op's one-shot on the Lamport protocol: its own launcher (hc_lamport_<op>), so no code.
ONE_SHOT_LAMPORT = Algorithm("one_shot_lamport", None, LAMPORT)
# A one-shot pipelined in chunks on the chunked protocol (its own launcher; chunk size and blocks
# from pipeline.py): all_gather_v, reduce_scatter_v.
ONE_SHOT_PIPELINED = Algorithm("one_shot_pipelined", None, CHUNKED)
# The gathers' kernels learn the others' counts after their first sends (csrc/own_count.cuh; the
# quantized ones before their rows, whose place in the output needs them); scatters and
# reductions need every count before they send (a Counts reaching them is exchanged first,
# counts.py).
OWN = {"own_count": True}
# The transitions as two row ops (two_step.py): gather = reduce_scatter_v(attn-TP) +
# all_gather_v(world), scatter = reduce_scatter_v(world) + all_gather_v(attn-TP). Last in the
# registry: tune's ties go to the one-kernel algorithms. The gather takes own counts: its
# all_gather_v step exchanges the chunk counts (in its kernel where that one can).
TWO_STEP = Algorithm("two_step", None, composed=True)
# The quantized gathers' (partial rows travel on LL packets in all: csrc/quant_rows.cuh). quant /
# quant_lamport: a row's owner sums its partial rows and sends it quantized (two hops, fewest
# bytes); quant_one_hop: every attention-TP rank sums and quantizes every row of its DP group
# itself, so rows of its own group take one hop (attn_tp = 1: the same as quant).
QUANT_ALGORITHMS = (Algorithm("quant", abi.QuantGatherAlgorithm.OWNER, **OWN),
                    Algorithm("quant_one_hop", abi.QuantGatherAlgorithm.ONE_HOP, **OWN),
                    Algorithm("quant_lamport", abi.QuantGatherAlgorithm.OWNER, LAMPORT, **OWN))
# gather_tokens' own: the unquantized one-shot Lamport gather, every rank quantizing every row it
# sums (csrc/lamport_quant_local.cu): one hop for every row, partial rows on the wire unquantized.
# Partial rows only, fused ones with one DP group (other groups' residuals are elsewhere): the rest
# run quant_one_hop instead, and with attn_tp = 1 quant (nvlink.py); so its capacity is the LL
# kernels' bound.
QUANT_LOCAL = Algorithm("quant_local", abi.QuantGatherAlgorithm.LOCAL, LAMPORT, **OWN)
# gather_tokens_norm on the Lamport protocol (csrc/lamport_fused_tokens.cu; its own launcher):
# one hop with one DP group (an all-reduce with the norm in its epilogue) or with attn_tp = 1 (a
# norm, then an all-gather), two with DP x TP, as `fused`. Rows wider than its staging
# (abi.MAX_QUANT_HIDDEN) run `fused` instead (nvlink.py), so its capacity is the LL kernel's bound.
FUSED_LAMPORT = Algorithm("fused_lamport", None, LAMPORT, **OWN)
OPS: dict[str, OpSpec] = {spec.name: spec for spec in (
    OpSpec("all_reduce", abi.OpCode.ALL_REDUCE, "input", "flat", (
        Algorithm("one_shot", abi.AllReduceAlgorithm.ONE_SHOT),
        Algorithm("two_shot", abi.AllReduceAlgorithm.TWO_SHOT, LL, chunked=True),
        Algorithm("two_shot_bulk", abi.AllReduceAlgorithm.TWO_SHOT_BULK, BULK, chunked=True), ONE_SHOT_LAMPORT,
        # its own launcher (hc_all_reduce_pipelined), with chunk size and blocks (pipeline.py)
        Algorithm("two_shot_pipelined", abi.AllReduceAlgorithm.TWO_SHOT_PIPELINED, CHUNKED, chunked=True,
                  sliced=True))),
    OpSpec("all_gather_v", abi.OpCode.ALL_GATHER_V, "output", "rows",
           (replace(ONE_SHOT, **OWN), replace(ONE_SHOT_LAMPORT, **OWN), ONE_SHOT_PIPELINED)),
    OpSpec("reduce_scatter_v", abi.OpCode.REDUCE_SCATTER_V, "input", "rows",
           (ONE_SHOT, ONE_SHOT_LAMPORT, ONE_SHOT_PIPELINED)),
    OpSpec("gather_tokens", abi.OpCode.GATHER_TOKENS, "output", "rows", (
        Algorithm("one_shot", abi.GatherTokensAlgorithm.ONE_SHOT, **OWN),
        Algorithm("two_shot", abi.GatherTokensAlgorithm.TWO_SHOT, **OWN), replace(ONE_SHOT_LAMPORT, **OWN),
        replace(TWO_STEP, **OWN)), on_world=True, reduces_to={"attn_tp": "all_gather_v"}),
    # gather_tokens with residual add + RMSNorm fused: its own algorithms (fused: gather_tokens'
    # kernel entry, on LL; fused_lamport: its own launcher).
    OpSpec("gather_tokens_norm", abi.OpCode.GATHER_TOKENS, "output", "rows", (
        Algorithm("fused", abi.GatherTokensAlgorithm.FUSED, **OWN), FUSED_LAMPORT), on_world=True),
    OpSpec("scatter_tokens", abi.OpCode.SCATTER_TOKENS, "input", "rows", (
        Algorithm("one_shot", abi.ScatterTokensAlgorithm.ONE_SHOT),
        Algorithm("two_shot", abi.ScatterTokensAlgorithm.TWO_SHOT), ONE_SHOT_LAMPORT, TWO_STEP),
        on_world=True, reduces_to={"attn_tp": "reduce_scatter_v"}),
    # quant= on all_gather_v / gather_tokens (optionally fused with the norm): one kernel, its
    # wire rows on LL packets (csrc/quant_gather.cu) or on the Lamport protocol
    # (csrc/lamport_quant_gather.cu); the format is a launcher argument. Errors report the base op.
    OpSpec("all_gather_v_quant", abi.OpCode.ALL_GATHER_V, "output", "rows", QUANT_ALGORITHMS, quantized=True),
    OpSpec("gather_tokens_quant", abi.OpCode.GATHER_TOKENS, "output", "rows", QUANT_ALGORITHMS + (QUANT_LOCAL,),
           on_world=True, quantized=True),
)}


@functools.cache
def reduced(op: str, algorithm: str, axis: str = "attn_tp") -> tuple[str, str]:
    """(the op `op` is where `axis` has size 1 (OpSpec.reduces_to), the algorithm it runs as
    there): the same algorithm where that op has it (the Lamport one-shot), else its first. Not
    for a composed algorithm, which runs its steps, each by the table (two_step.py)."""
    other = OPS[op].reduces_to[axis]
    names = [a.name for a in OPS[other].algorithms]
    return other, algorithm if algorithm in names else names[0]


def op_name(code: int) -> str:
    """The op a kernel's error word names (the first registered op with that code)."""
    for spec in OPS.values():
        if spec.code == code:
            return spec.name
    return f"op {code}"


def algorithms_where(predicate) -> dict[str, str]:
    """op -> the name of its (first) algorithm for which predicate(algorithm) holds."""
    found = {}
    for spec in OPS.values():
        for a in spec.algorithms:
            if predicate(a):
                found[spec.name] = a.name
                break
    return found


def describe() -> str:
    """One line per op: its algorithms, their protocols, and whether their kernel exchanges a
    Counts' own count (`hybridcomm info`)."""
    return "\n".join(f"  {s.name:<19} " + ", ".join(f"{a.name} ({_how(a)}{', own counts' * a.own_count})"
                                                     for a in s.algorithms)
                     + "".join(f"; {axis}=1: {other}" for axis, other in s.reduces_to.items())
                     for s in OPS.values())


def _how(a: Algorithm) -> str:
    return "two ops, each by the table" if a.composed else a.protocol.name
