"""Shared fixtures: long-lived pools of gloo (or NCCL) worker processes, one per world size.

Functions run on the workers must be module-level in an importable module (the test
modules themselves are importable: pytest puts tests/ on sys.path, and spawned workers
inherit it). Every pool call has a timeout, so a hung collective fails its test instead
of hanging the suite.
"""

import pytest
import torch

from hybridcomm.spmd import SpmdPool


@pytest.fixture(scope="session")
def pool():
    pools: dict[tuple[int, str], SpmdPool] = {}

    def get(world_size: int, device: str = "cpu") -> SpmdPool:
        key = (world_size, device)
        if key not in pools or not pools[key].alive:
            pools[key] = SpmdPool(world_size, device)
        return pools[key]

    yield get
    for p in pools.values():
        p.close()


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def needs_gpus(n: int):
    return pytest.mark.skipif(gpu_count() < n, reason=f"needs {n} CUDA GPUs, found {gpu_count()}")
