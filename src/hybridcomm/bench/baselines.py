"""Buffers for the baselines every benchmark runs in the same process as our kernels.

- nccl:      plain NCCL through torch.distributed on ordinary tensors.
- nccl_symm: the same collectives on tensors from a memory pool registered with NCCL as
             symmetric windows (NCCL's low-latency symmetric kernels).
- symm_mem:  torch symmetric memory's one-shot / two-shot all-reduce (unicast; NVLink
             multicast stays off: TORCH_SYMM_MEM_DISABLE_MULTICAST=1).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


SHARED_GPU = "not run: ranks share a GPU, and NCCL and symmetric memory refuse two ranks on one device"


class NcclSymmetricBuffers:
    """Flat byte buffers from an NCCL-registered pool (backends.nccl_symm.register_buffers);
    `view` cuts typed tensors from them."""

    def __init__(self, nbytes: list[int], device: torch.device):
        from ..backends.nccl_symm import register_buffers

        try:
            self.pool, self.buffers, self.error = register_buffers(nbytes, device, [dist.group.WORLD])
        except Exception as e:  # report, do not hide: the table shows the column as missing
            self.buffers, self.error = None, f"{type(e).__name__}: {e}"

    @classmethod
    def absent(cls, why: str) -> "NcclSymmetricBuffers":
        """No buffers, and why (ranks sharing a GPU: NCCL refuses them)."""
        made = cls.__new__(cls)
        made.pool, made.buffers, made.error = None, None, why
        return made

    def view(self, index: int, shape, dtype) -> torch.Tensor:
        n = 1
        for s in shape:
            n *= s
        return self.buffers[index][: n * torch.finfo(dtype).bits // 8].view(dtype).view(shape)


class SymmMemBuffer:
    """One rendezvoused symmetric buffer for torch.ops.symm_mem all-reduces."""

    def __init__(self, nbytes: int, device: torch.device):
        from torch.distributed import _symmetric_memory as symm_mem

        self.error = None
        self.group_name = dist.group.WORLD.group_name
        try:
            self.buffer = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
            symm_mem.rendezvous(self.buffer, dist.group.WORLD)
        except Exception as e:
            self.buffer, self.error = None, f"{type(e).__name__}: {e}"

    @classmethod
    def absent(cls, why: str) -> "SymmMemBuffer":
        """No buffer, and why (ranks sharing a GPU: the rendezvous refuses them)."""
        made = cls.__new__(cls)
        made.buffer, made.error, made.group_name = None, why, None
        return made

    def view(self, numel: int, dtype) -> torch.Tensor:
        return self.buffer[: numel * torch.finfo(dtype).bits // 8].view(dtype)

    def one_shot(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.symm_mem.one_shot_all_reduce(x, "sum", self.group_name)

    def two_shot(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.symm_mem.two_shot_all_reduce_(x, "sum", self.group_name)


def baseline_buffers(symm_bytes: list[int], symm_mem_bytes: int, device: torch.device,
                     share_gpus: bool = False) -> tuple[NcclSymmetricBuffers, SymmMemBuffer]:
    """The NCCL-symmetric buffers and the symm_mem buffer of a benchmark; none where ranks
    share a GPU (bench/shared.py), since both refuse two ranks on one device."""
    if share_gpus:
        return NcclSymmetricBuffers.absent(SHARED_GPU), SymmMemBuffer.absent(SHARED_GPU)
    return NcclSymmetricBuffers(symm_bytes, device), SymmMemBuffer(symm_mem_bytes, device)
