"""The knobs of the pipelined algorithms on the chunked protocol (the two-shot all_reduce,
csrc/pipelined_all_reduce.cu; the one-shots of all_gather_v and reduce_scatter_v,
csrc/pipelined_<op>.cu): how big a chunk is and how many blocks run the pipeline, per message
size (the op's message tensor, ops.OPS; the row ops reuse the all_reduce's entries until they
are measured on their own).

A chunk is the unit of the pipeline: one release flag per chunk, and the reduce of chunk k
overlaps the transfer of chunk k + 1. Smaller chunks pipeline more finely and pay more flags;
more blocks put more SMs on NVLink and take them from whatever runs beside. Chunk sizes are
powers of two in [abi.MIN_CHUNK_BYTES, abi.MAX_CHUNK_BYTES] (the kernel raises one where a
shard would need more than abi.MAX_CHUNKS chunks); blocks beyond the SMs or the chunks of a
shard are not launched. Every rank must use the same chunk size (the call's fingerprint
carries it); block counts may differ.

PIPELINE_TABLE is data: `scripts/pipeline_sweep.py` measures (chunk, blocks) pairs against the
baselines, and its winners go here. An NvlinkBackend's `pipeline` attribute, when set, wins
over the table (the sweep sets it).
"""

from __future__ import annotations

from dataclasses import dataclass

from .abi import MAX_BLOCKS, MAX_CHUNK_BYTES, MIN_CHUNK_BYTES

KiB, MiB = 1 << 10, 1 << 20


@dataclass(frozen=True)
class PipelineParams:
    chunk_bytes: int
    blocks: int

    def __post_init__(self):
        c = self.chunk_bytes
        if not (isinstance(c, int) and MIN_CHUNK_BYTES <= c <= MAX_CHUNK_BYTES and c & (c - 1) == 0):
            raise ValueError(f"chunk_bytes: expected a power of two in [{MIN_CHUNK_BYTES}, {MAX_CHUNK_BYTES}], "
                             f"got {c!r}")
        if not (isinstance(self.blocks, int) and 1 <= self.blocks <= MAX_BLOCKS):
            raise ValueError(f"blocks: expected an int in [1, {MAX_BLOCKS}], got {self.blocks!r}")


# (largest message in bytes, params) in increasing size; the last holds every larger message.
# From `scripts/pipeline_sweep.py --world 2` on 2x H200 (results/2xH200/pipelined/README.md):
# the most blocks won at every size from 2 MiB (NVLink wants every SM's stores in flight;
# MAX_BLOCKS is capped at the SM count), 16 KiB chunks at 2-4 MiB, 64 KiB from 8 MiB (256 KiB
# only wins where one call holds 64 MiB, which the default workspace does not). Not measured
# on 4 GPUs, nor below 2 MiB, where the table never picks this algorithm.
PIPELINE_TABLE: tuple[tuple[int | None, PipelineParams], ...] = (
    (4 * MiB, PipelineParams(16 * KiB, MAX_BLOCKS)),
    (None, PipelineParams(64 * KiB, MAX_BLOCKS)),
)


def params_for(nbytes: int, table=PIPELINE_TABLE) -> PipelineParams:
    """The params of the first entry that holds a message of `nbytes`."""
    for limit, params in table:
        if limit is None or nbytes <= limit:
            return params
    return table[-1][1]
