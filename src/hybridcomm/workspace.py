"""The nvlink backend's memory: one symmetric buffer per communicator, cut into regions.

Every distinct group inside one node (attn_tp, attn_dp, moe_tp, moe_ep, world, and across nodes
the node parts `<group>/node` of groups that span nodes, topology.py; groups with
the same members share one) gets a region on every rank:

    [flags 16.5 KiB][slot 0: area A x n, area B x n][slot 1: area A x n, area B x n]
    [Lamport slot 0: area x n][Lamport slot 1: area x n][Lamport slot 2: area x n]
    [chunk flags 256 KiB][chunked slot 0: area A x n, area B x n][chunked slot 1: the same]

An area receives one source's data for one phase of one call: LL packets (16 bytes per 8
bytes of payload: at most area_bytes / 2 of payload) or bulk data (at most area_bytes).
Lamport areas (csrc/lamport.cuh, docs/lamport.md) hold data 1:1 and start filled with the
sentinel (0xFF bytes); they are separate from the LL/bulk areas, which hold packets and zeros
where these must hold the sentinel wherever no data is due. The chunked areas (the pipelined
two-shot, csrc/chunked.cuh) hold plain data 1:1 and are shared with nobody, so nothing needs
zeroing after them; their per-chunk flags start at zero.
Peers write straight into each other's regions (PyTorch symmetric memory gives the peer
pointers; ranks that share a GPU, in tests, map each other's buffers by CUDA IPC:
shared_gpu.py). Memory per GPU: sum over regions of flags + (4 + 3 + 4) * n * area_bytes, or
(4 + 3) * n * area_bytes without the chunked section (Workspace: only where the table can pick
a pipelined algorithm).

Each region also has a small local state (call counter, block counter, abort flag; Lamport
slot and units used) in device memory; the error word is shared by the communicator and
mirrored to pinned host memory, so the host can check for errors on every call without
synchronising.
"""

from __future__ import annotations

import ctypes
import warnings

import torch
import torch.distributed as dist

from . import shared_gpu
from .abi import (CHUNK_FLAG_BYTES, FLAG_BYTES, LAMPORT_SLOTS, LAMPORT_STATE_WORDS, MAX_BLOCKS, MAX_RANKS,
                  STATE_WORDS, GroupArgs, LamportArgs, decode_error)
from .groups import Group, leg_name, member_sets
from .layout import GROUP_NAMES, Layout
from .ops import LAMPORT, LL

DEFAULT_AREA_BYTES = 4 << 20


def ll_bytes(members: int, area_bytes: int) -> int:
    """Flags and the LL/bulk slots at the start of a region; the Lamport slots follow."""
    return FLAG_BYTES + 2 * 2 * members * area_bytes


def chunked_offset(members: int, area_bytes: int) -> int:
    """Where the chunked section starts in a region (csrc/chunked.cuh chunked_section)."""
    return ll_bytes(members, area_bytes) + LAMPORT_SLOTS * members * area_bytes


def chunked_bytes(members: int, area_bytes: int) -> int:
    """The chunked section: its flags and 2 slots x 2 phases of areas."""
    return CHUNK_FLAG_BYTES + 2 * 2 * members * area_bytes


def region_bytes(members: int, area_bytes: int, chunked: bool = True) -> int:
    """chunked: whether the region ends with the chunked section (only where the Communicator's
    table can pick a pipelined algorithm: Workspace)."""
    return chunked_offset(members, area_bytes) + (chunked_bytes(members, area_bytes) if chunked else 0)


def region_groups(layout: Layout) -> tuple[dict[str, tuple], str | None]:
    """Group name -> partition key (all groups of that name) for every group name that gets a
    region, and why none do (or None). The same on every rank. Regions exist for groups of
    2+ ranks inside one node: on one node every group; across nodes the groups that stay in
    a node and the node parts (`<group>/node`) of those that do not."""
    per_node = layout.ranks_per_node or layout.world_size
    if per_node > MAX_RANKS:
        return {}, f"{per_node} ranks per node; our kernels handle groups of 2-{MAX_RANKS}"
    keys = {name: tuple(sets) for name, sets in member_sets(layout).items()
            if len(sets[0]) > 1 and not layout.spans_nodes(sets[0])}
    if not keys:
        return {}, "no group of 2+ ranks inside one node"
    return keys, None


def memory_plan(layout: Layout, area_bytes: int) -> list[tuple[list[str], int, int]]:
    """(group names sharing a region, members per group, region bytes) per region, in
    allocation order. Needs no GPU: `hybridcomm info` prints it."""
    keys, _ = region_groups(layout)
    plan = []
    for key in dict.fromkeys(keys.values()):
        names = [n for n, k in keys.items() if k == key]
        plan.append((names, len(key[0]), region_bytes(len(key[0]), area_bytes)))
    return plan


def describe_plan(layout: Layout, area_bytes: int) -> str:
    keys, blocker = region_groups(layout)
    if blocker:
        return f"nvlink workspace: none ({blocker})"
    plan = memory_plan(layout, area_bytes)
    total = sum(p[2] for p in plan)
    chunked = sum(chunked_bytes(n, area_bytes) for _, n, _ in plan)
    lines = [f"nvlink workspace: {total / 2**20:.1f} MiB per GPU ({area_bytes >> 10} KiB per peer and slot: "
             f"2 slots x 2 phases LL/bulk, 3 slots Lamport, 2 slots x 2 phases chunked; "
             f"{LL.capacity(area_bytes) >> 10} KiB of LL, "
             f"{LAMPORT.capacity(area_bytes) >> 10} KiB of Lamport payload per peer and call); the chunked "
             f"sections, {chunked / 2**20:.1f} MiB of it, only where the table can pick a pipelined algorithm"]
    lines += [f"  {'/'.join(names)}: groups of {n}, {size / 2**20:.1f} MiB" for names, n, size in plan]
    return "\n".join(lines)


def peer_access_blocker(layout: Layout, device: torch.device) -> str | None:
    count = torch.cuda.device_count()
    if count < layout.world_size:
        return None  # one visible GPU per process: the symmetric-memory rendezvous decides
    for other in range(layout.world_size):
        if other != device.index and not torch.cuda.can_device_access_peer(device.index, other):
            return f"GPU {device.index} has no peer access to GPU {other}"
    return None


def agreed_max_blocks(device: torch.device, group, max_sms: int | None) -> int:
    """The most blocks a kernel launches: one per SM of the GPU, or max_sms (fewer leave SMs to
    other work, and must fit what a green context or an MPS limit gives: every block of a
    kernel must be resident at once), at most MAX_BLOCKS; the smallest over the ranks that
    share memory, since a kernel's grid must be the same on every member (the bulk protocol's
    flags are per block)."""
    mine = min(torch.cuda.get_device_properties(device).multi_processor_count, max_sms or MAX_BLOCKS, MAX_BLOCKS)
    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    return min(everyone)


class Workspace:
    """chunked: the regions end with the chunked protocol's section (the pipelined algorithms);
    the Communicator asks for it only where its table can pick one of those, since it is 4/11
    of the areas (129 MiB per GPU of a DP2xTP2 world of 4, default workspace)."""

    def __init__(self, layout: Layout, groups: dict[str, Group], device: torch.device,
                 area_bytes: int, timeout_s: float, chunked: bool = True, max_sms: int | None = None):
        if area_bytes <= 0 or area_bytes % 16:
            raise ValueError(f"workspace_bytes: expected a positive multiple of 16, got {area_bytes}")
        self.area_bytes, self.layout, self.chunked = area_bytes, layout, chunked
        self.keys, self.blocker = region_groups(layout)
        self.blocker = self.blocker or peer_access_blocker(layout, device)
        self.args: dict[str, GroupArgs] = {}
        self.lamport_args: dict[str, LamportArgs] = {}
        self.total_bytes = 0
        if self.blocker:
            self.keys = {}
            return
        partitions = list(dict.fromkeys(self.keys.values()))  # same order on every rank
        offsets, sizes = {}, {}
        for key in partitions:
            offsets[key] = self.total_bytes
            sizes[key] = region_bytes(len(key[0]), area_bytes, chunked)
            self.total_bytes += sizes[key]
        # Lamport areas: from the end of the LL/bulk slots to the chunked section
        sentinels = [(offsets[k] + ll_bytes(len(k[0]), area_bytes),
                      offsets[k] + chunked_offset(len(k[0]), area_bytes)) for k in partitions]
        # Peers share memory inside a node only: the rendezvous is over this rank's node.
        node = groups.get(leg_name("world", "node")) if layout.num_nodes > 1 else None
        peer_group = node.pg if node else dist.group.WORLD
        peers = dict(zip(node.ranks if node else range(layout.world_size),
                         self._rendezvous(device, peer_group, sentinels)))
        self.max_blocks = agreed_max_blocks(device, peer_group, max_sms)
        self.error_word = torch.zeros(1, dtype=torch.int64, device=device)
        self.error_mirror = torch.zeros(1, dtype=torch.int64, pin_memory=True)
        try:  # a numpy view reads in ~0.1 µs; without numpy the tensor read costs a few µs
            self._error_view = self.error_mirror.numpy()
        except RuntimeError:
            self._error_view = self.error_mirror
        # GroupState words, then LamportState words
        self.states = {key: torch.zeros(STATE_WORDS + LAMPORT_STATE_WORDS, dtype=torch.int32, device=device)
                       for key in partitions}
        for name, key in self.keys.items():
            g = groups[name]
            self.args[name] = GroupArgs(
                nranks=g.size, me=g.index,
                world_ranks=(ctypes.c_int * MAX_RANKS)(*g.ranks),
                regions=(ctypes.c_void_p * MAX_RANKS)(*[peers[r] + offsets[key] for r in g.ranks]),
                state=self.states[key].data_ptr(), error_word=self.error_word.data_ptr(),
                error_mirror=self.error_mirror.data_ptr(), area_bytes=area_bytes,
                timeout_ns=int(timeout_s * 1e9), group_id=GROUP_NAMES.index(name.split("/")[0]),
                max_blocks=self.max_blocks)
            lamport = offsets[key] + ll_bytes(g.size, area_bytes)
            self.lamport_args[name] = LamportArgs(
                bases=(ctypes.c_void_p * MAX_RANKS)(*[peers[r] + lamport for r in g.ranks]),
                state=self.states[key].data_ptr() + 4 * STATE_WORDS, area_bytes=area_bytes)

    def _rendezvous(self, device: torch.device, group, sentinel_ranges: list[tuple[int, int]]) -> list[int]:
        if shared_gpu.ranks_share_a_gpu(device, group):  # tests on a one-GPU machine (shared_gpu.py)
            self.handle = shared_gpu.IpcBuffers(self.total_bytes, device, group)
            self.buffer = self.handle.buffer
        else:
            self._symmetric(device, group)
        self.buffer.zero_()  # flags start at 0; call flags start at 1
        for begin, end in sentinel_ranges:  # Lamport areas start as "nothing arrived"
            self.buffer[begin:end].fill_(0xFF)
        torch.cuda.synchronize(device)
        dist.barrier(group=group)
        return [int(p) for p in self.handle.buffer_ptrs]

    def _symmetric(self, device: torch.device, group) -> None:
        from torch.distributed import _symmetric_memory as symm_mem

        if hasattr(symm_mem, "enable_symm_mem_for_group"):  # needed by older torch, a no-op later
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                symm_mem.enable_symm_mem_for_group(group.group_name)
        self.buffer = symm_mem.empty(self.total_bytes, dtype=torch.uint8, device=device)
        self.handle = symm_mem.rendezvous(self.buffer, group)

    def close(self) -> None:
        """Drop every reference to the workspace's memory: the symmetric buffer and its
        rendezvous handle (peers' mappings), the error word and its pinned mirror, the
        per-region states. The caller synchronised the device first."""
        for name in ("buffer", "handle", "error_word", "error_mirror", "_error_view", "states"):
            if hasattr(self, name):
                delattr(self, name)
        self.args, self.lamport_args, self.keys, self.total_bytes = {}, {}, {}, 0
        self.blocker = "the communicator was closed"

    def recorded_error(self):
        """The error the kernels recorded (abi.RecordedError), or None."""
        word = int(self._error_view[0])
        return decode_error(word) if word else None

    def clear_error(self) -> None:
        self.error_word.zero_()
        self.error_mirror.zero_()

    def describe(self) -> str:
        if self.blocker:
            return f"nvlink workspace: none ({self.blocker})"
        return describe_plan(self.layout, self.area_bytes)
