"""The pipelined two-shot all_reduce without a GPU: its knobs (pipeline.py), its place in the
registry, the selection tables and the workspace. The kernel itself: tests/test_gpu_pipelined.py."""

import pytest

from hybridcomm import abi, algorithms, ops, pipeline, workspace
from hybridcomm.pipeline import KiB, MiB, PipelineParams, params_for


@pytest.mark.parametrize("chunk", [0, 512, 3 * KiB, 1 * MiB, 2.0 * KiB, None])
def test_a_chunk_size_that_is_not_a_power_of_two_in_range_names_chunk_bytes(chunk):
    with pytest.raises(ValueError, match="chunk_bytes"):
        PipelineParams(chunk, 16)


@pytest.mark.parametrize("blocks", [0, -1, abi.MAX_BLOCKS + 1, 1.5])
def test_a_block_count_out_of_range_names_blocks(blocks):
    with pytest.raises(ValueError, match="blocks"):
        PipelineParams(4 * KiB, blocks)


def test_the_limits_are_the_kernels():
    PipelineParams(abi.MIN_CHUNK_BYTES, 1)
    PipelineParams(abi.MAX_CHUNK_BYTES, abi.MAX_BLOCKS)
    # The fingerprint's 4-bit variant field holds log2(chunk / min) for every legal chunk size.
    assert (abi.MAX_CHUNK_BYTES // abi.MIN_CHUNK_BYTES).bit_length() - 1 < 16


def test_params_follow_the_message_size_and_the_last_entry_holds_every_size():
    table = ((1 * MiB, PipelineParams(8 * KiB, 16)), (None, PipelineParams(64 * KiB, 32)))
    assert params_for(16, table) == PipelineParams(8 * KiB, 16)
    assert params_for(1 * MiB, table) == PipelineParams(8 * KiB, 16)
    assert params_for(1 * MiB + 16, table) == PipelineParams(64 * KiB, 32)
    limits = [limit for limit, _ in pipeline.PIPELINE_TABLE[:-1]]
    assert limits == sorted(limits) and pipeline.PIPELINE_TABLE[-1][0] is None


def test_the_algorithm_is_a_chunked_two_shot_that_the_2xh200_table_and_forced_tables_run():
    alg = ops.OPS["all_reduce"].algorithm("two_shot_pipelined")
    assert alg.protocol is ops.CHUNKED and alg.chunked and alg.code == abi.AllReduceAlgorithm.TWO_SHOT_PIPELINED
    assert alg.sliced  # the launcher cuts a message beyond the workspace into calls: no size limit
    # 16-byte units, one shard per member: what one peer receives per phase, rounded up
    assert ops.OPS["all_reduce"].per_peer_bytes(alg, 1001 * 16, 4) == 251 * 16
    assert ops.CHUNKED.capacity(4 * MiB) == 4 * MiB
    assert algorithms.NAMED_TABLES["pipelined"]["all_reduce"] == (algorithms.Rule(None, "nvlink", alg.name),)
    assert all(rule.algorithm != alg.name for rule in algorithms.TABLE["all_reduce"])  # not measured on 4 GPUs
    assert any(rule.algorithm == alg.name for rule in algorithms.node_tables("2xH200")[1]["all_reduce"])


def test_the_workspace_holds_chunked_areas_only_where_the_table_can_pick_a_pipelined_algorithm():
    assert not algorithms.picks_protocol(algorithms.node_tables(None), ops.CHUNKED)  # the built-in tables
    assert algorithms.picks_protocol(algorithms.node_tables("2xH200"), ops.CHUNKED)
    assert algorithms.picks_protocol(algorithms.node_tables("pipelined"), ops.CHUNKED)
    assert algorithms.picks_protocol(algorithms.node_tables("lamport"), ops.LAMPORT)
    area = 4 * MiB
    for members in (2, 4):
        without = workspace.region_bytes(members, area, chunked=False)
        assert without == workspace.chunked_offset(members, area)
        assert workspace.region_bytes(members, area) == without + workspace.chunked_bytes(members, area)


@pytest.mark.parametrize("members", [2, 4, 8])
def test_region_ends_with_the_chunk_flags_and_two_slots_of_two_chunked_areas(members):
    area = 4 << 20
    begin = workspace.chunked_offset(members, area)
    assert begin == workspace.ll_bytes(members, area) + abi.LAMPORT_SLOTS * members * area
    assert workspace.region_bytes(members, area) == begin + abi.CHUNK_FLAG_BYTES + 4 * members * area
    assert abi.CHUNK_FLAG_BYTES == 2 * abi.MAX_RANKS * abi.MAX_CHUNKS * 4
    # the smallest chunk times the flags covers the default area: no raise below it
    assert abi.MIN_CHUNK_BYTES * abi.MAX_CHUNKS >= workspace.DEFAULT_AREA_BYTES


@pytest.mark.parametrize("op", ["all_gather_v", "reduce_scatter_v"])
def test_row_ops_have_a_pipelined_one_shot_limited_by_the_area(op):
    alg = ops.OPS[op].algorithm("one_shot_pipelined")
    assert alg.protocol is ops.CHUNKED and not alg.chunked and not alg.sliced  # a member's rows fit one area
    assert ops.OPS[op].per_peer_bytes(alg, 3 * MiB, 4) == 3 * MiB
    assert algorithms.NAMED_TABLES["pipelined"][op] == (algorithms.Rule(None, "nvlink", alg.name),)
    assert all(rule.algorithm != alg.name for rule in algorithms.TABLE[op])
    # its fingerprint differs from the LL one-shot's (0) and the Lamport one-shot's (8 + slot)
    assert abi.CHUNKED_ONE_SHOT not in (0, *range(abi.LAMPORT_ONE_SHOT, abi.LAMPORT_ONE_SHOT + abi.LAMPORT_SLOTS))
