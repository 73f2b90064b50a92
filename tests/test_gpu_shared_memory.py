"""Ranks sharing one GPU (src/hybridcomm/shared_gpu.py): a closed Communicator gives its workspace
back. Until each peer got its own CUDA IPC share, 3 or more ranks on one GPU kept every closed
workspace (0.4 GiB per rank and communicator on world 8). Runs where GPU ranks share a GPU
(`pytest -m gpu --gpu-ranks 4` on one GPU); with one GPU per rank the workspace is symmetric memory."""

import pytest

from conftest import gpu_world, needs_gpus, sharing_gpus
from hybridcomm import Layout

pytestmark = [pytest.mark.gpu, needs_gpus(3),
              pytest.mark.skipif(not sharing_gpus(), reason="for ranks sharing a GPU (--gpu-ranks)")]

WORLD = gpu_world()


def _allocated_after_close(layout: Layout) -> tuple[int, int, int]:
    """Worker: this rank's allocated bytes before a communicator, with it (after one op), and after
    every rank closed it."""
    import gc

    import torch
    import torch.distributed as dist

    from hybridcomm.communicator import Communicator
    from hybridcomm import spmd

    def settled() -> int:
        gc.collect()
        dist.barrier()  # every peer has dropped its mapping of this rank's workspace
        torch.cuda.ipc_collect()  # frees the blocks whose every consumer let go
        return torch.cuda.memory_allocated()

    before = settled()
    comm = Communicator(layout, device=spmd.worker_device)
    x = torch.randn(64, 4096, device=comm.device, dtype=torch.bfloat16)
    comm.all_reduce(x)
    del x
    torch.cuda.synchronize()
    made = torch.cuda.memory_allocated()
    comm.close()
    del comm
    return before, made, settled()


@pytest.mark.parametrize("layout", [Layout(WORLD), Layout(WORLD, attn_tp=2)], ids=lambda lay: lay.name)
def test_a_closed_communicator_gives_its_workspace_back(pool, layout):
    for rank, (before, made, after) in enumerate(pool(WORLD, "cuda").run(_allocated_after_close, layout,
                                                                          timeout=300)):
        assert made - before > 64 << 20, f"rank {rank}: no workspace was made ({made - before} bytes)"
        assert after <= before, f"rank {rank}: {after - before} bytes still allocated after close"
