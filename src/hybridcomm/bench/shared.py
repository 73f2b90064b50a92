"""`bench ops|transitions --share-gpus`: our kernels timed with several ranks on one GPU, under
CUDA MPS, to compare two builds of the kernels on a machine that has one GPU.

What it can show: what a kernel change costs on the device side (instructions, register
spills, flag handling), since both builds run the same calls on the same GPU in the same way.
What it cannot show: anything about NVLink or about the baselines. The peers' memory is the
same GPU's memory (L2 and HBM, far faster than NVLink), and NCCL and torch symmetric memory
refuse two ranks on one GPU, so only our forced algorithms (the hc_<algorithm> columns) run,
and, in `bench quant`, the default Communicator's calls that the bytes floor reads (ours_only).
No number from it is a speed claim against anything but another build of our kernels.

Why MPS: without it the GPU runs each rank's context in turn, so a kernel that waits for a
peer spins until the peer's time slice (milliseconds a call). Under MPS the ranks' kernels run
side by side. The daemon is started outside (scripts/shared_gpu_timing.sh); `mps_running`
only reports whether one is up, and the results carry that answer.
Why a budget of SMs: every block of a kernel must be resident at once (a block waits for its
peers' blocks), so the ranks on one GPU split its SMs. And each rank may hold two of our kernels
at once: with programmatic dependent launch (csrc/pdl.cuh) its next kernel's blocks become
resident, and wait there, as soon as every block of the current one has started. On its own GPU
that is safe (the current kernel's blocks are all resident by then); on a shared one the next
kernel's early blocks can take the SMs a peer's current kernel still needs, and both wait until
the deadline. With 49 blocks a kernel (3/4 of an even split of an H100's 132 SMs between 2 ranks)
`bench quant` at TP2 nvfp4 1024 tokens so timed out in 3 of 4 runs and crawled in the fourth
(1,382 us against ~95); with PDL off, or with half that budget, it never did (run 84 of
results/shared_1xH100). So the SMs are split between ranks x RESIDENT_KERNELS, with a quarter
of that left free (`sm_share`), the same for both builds. (An even split between ranks alone hung
earlier too: a one-shot all_reduce of 512 KB with 66 blocks each, 2026-11-23.) `--max-sms N`
columns keep the N given: above `sm_share` they may not fit beside the other ranks and time out.
"""

from __future__ import annotations

import os

import torch

NOTE = ("ranks shared one GPU under CUDA MPS (bench/shared.py): our kernels only, peer memory on the same GPU; "
        "compare two builds of the kernels with it, nothing else")


def ranks_per_gpu(world_size: int) -> int:
    return -(-world_size // max(torch.cuda.device_count(), 1))


RESIDENT_KERNELS = 2  # of one rank at once under PDL: the current kernel and the next one's early blocks


def sm_share(world_size: int) -> int:
    """The blocks each rank's kernels may launch so that every rank's grids are resident at once:
    3/4 of an even split of the SMs between ranks x RESIDENT_KERNELS (the module's docstring)."""
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return max(1, sms // (ranks_per_gpu(world_size) * RESIDENT_KERNELS) * 3 // 4)


def mps_running() -> bool:
    """Whether an MPS control daemon serves this process's pipe directory (its clients then share
    the GPU): the daemon's control pipe exists there (/tmp/nvidia-mps unless CUDA_MPS_PIPE_DIRECTORY)."""
    return os.path.exists(os.path.join(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps", "control"))


def description(world_size: int) -> dict:
    """What a shared run records next to its numbers."""
    return {"note": NOTE, "ranks_per_gpu": ranks_per_gpu(world_size), "max_sms": sm_share(world_size),
            "mps": mps_running()}


def ours_only(calls: dict, forced: dict, also: tuple[str, ...] = ()) -> dict:
    """The calls of our forced Communicators (the only ones that run with ranks sharing a GPU),
    and those named in `also`: calls of a default Communicator that run our kernels (on_nvlink)."""
    return {name: call for name, call in calls.items() if name in forced or name in also}


def on_nvlink(calls: dict, comm, names: tuple[str, ...]) -> tuple[str, ...]:
    """Those of `names` (calls of the default Communicator `comm`) that its table sends to our
    kernels at this size, each made once to see (`comm.last_choice`). Beyond our kernels' sizes
    the table picks NCCL, which ranks sharing a GPU cannot run: the call falls back to the
    reference backend over gloo, which a CUDA graph cannot capture (hidden 7168 x 1024 tokens
    stopped `bench quant --share-gpus` so, run 84 of results/shared_1xH100). Collective: every
    rank asks for the same calls."""
    kept = []
    for name in names:
        calls[name]()
        if comm.last_choice.backend == "nvlink":
            kept.append(name)
    return tuple(kept)
