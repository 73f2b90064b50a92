"""Ranks that share one GPU: how the nvlink workspace is mapped when they do.

Production runs one rank per GPU, and the workspace is PyTorch symmetric memory, whose
rendezvous refuses two ranks on one device. On a machine with one GPU the kernels can still
be *tested* with several ranks (processes) on it: each rank allocates its workspace with the
caching allocator and the others map it through CUDA IPC (the handles torch.multiprocessing
sends), so every rank holds every peer's pointer, as after the symmetric rendezvous.

What this is good for: correctness. The processes are separate CUDA contexts, which the GPU
runs by time slices, not side by side: a kernel that waits for a peer spins until the GPU
switches to the peer's context. Calls take time slices (milliseconds), not microseconds, so
nothing timed this way means anything; the kernels' deadlines (timeout_s) still bound every
wait. Process groups are gloo there (NCCL refuses two ranks on one GPU), so the communicator
has no NCCL backend (communicator.py): what the table would send to NCCL runs on the
reference backend.

Memory: torch counts the consumers of a shared CUDA block with one counter per share: it
starts at 1, each consumer takes 1 off when it drops its mapping, and the producer frees the
block once the counter is back to 0: when it frees the block, if the consumers let go first,
else later (torch.cuda.ipc_collect(), its next free of a shared block, an out-of-memory retry).
The counter is read unsigned, so one share opened by 7 peers ends at -6 and the block is never
freed. Before each peer got its own share, a closed Communicator kept its
workspace when 3 or more ranks shared a GPU (0.4 GiB per rank and communicator on world 8).
IpcBuffers therefore makes one share per peer.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def ranks_share_a_gpu(device: torch.device, group) -> bool:
    """Whether two members of `group` run on one GPU (their UUIDs compared). Collective."""
    ids: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(ids, str(torch.cuda.get_device_properties(device).uuid), group=group)
    return len(set(ids)) < len(ids)


class IpcBuffers:
    """This rank's buffer of `nbytes` and every member's, mapped here through CUDA IPC.
    Collective over `group`. Holds the peers' mappings until dropped."""

    def __init__(self, nbytes: int, device: torch.device, group):
        self.buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
        size, me = dist.get_world_size(group), dist.get_rank(group)
        everyone: list = [None] * size  # everyone[i][j]: member i's share made for member j
        dist.all_gather_object(everyone, shares_for_peers(self.buffer, size, me), group=group)
        self.peers = [self.buffer if i == me else _open(everyone[i][me]) for i in range(size)]

    @property
    def buffer_ptrs(self) -> list[int]:
        return [t.data_ptr() for t in self.peers]


def shares_for_peers(buffer: torch.Tensor, size: int, me: int) -> list:
    """The IPC handles of `buffer` for each other member, one share each: a share's counter
    goes back to 0 only if exactly one consumer opens it (module docstring)."""
    from torch.multiprocessing.reductions import reduce_tensor
    return [None if i == me else reduce_tensor(buffer)[1] for i in range(size)]


def _open(args) -> torch.Tensor:
    from torch.multiprocessing.reductions import rebuild_cuda_tensor
    return rebuild_cuda_tensor(*args)
