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

Memory: here a closed Communicator does not give its workspace back. Measured with 8 ranks on
one H100 (2026-11-24): after close, gc, a barrier and torch.cuda.ipc_collect(), with no
IpcBuffers left alive, every rank's allocated memory stayed where it was. A guess, not
checked: torch's CUDA IPC keeps a block it shared until its consumers' releases reach it, and
they had not. Tests that make many communicators start fresh workers instead (tests/conftest.py,
release_shared_gpu_workers).
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
        from torch.multiprocessing.reductions import reduce_tensor

        self.buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
        _, args = reduce_tensor(self.buffer)
        everyone: list = [None] * dist.get_world_size(group)
        dist.all_gather_object(everyone, args, group=group)
        me = dist.get_rank(group)
        self.peers = [self.buffer if i == me else _open(a) for i, a in enumerate(everyone)]

    @property
    def buffer_ptrs(self) -> list[int]:
        return [t.data_ptr() for t in self.peers]


def _open(args) -> torch.Tensor:
    from torch.multiprocessing.reductions import rebuild_cuda_tensor
    return rebuild_cuda_tensor(*args)
