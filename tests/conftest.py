"""Shared fixtures: long-lived pools of gloo (or NCCL) worker processes, one per world size.

Functions run on the workers must be module-level in an importable module (the test
modules themselves are importable: pytest puts tests/ on sys.path, and spawned workers
inherit it). Every pool call has a timeout, so a hung collective fails its test instead
of hanging the suite, and after a failed test the pools start afresh, so one failure (a
PeerTimeout breaks the communicators the workers keep) does not fail the tests after it.

`pytest --gpu-ranks N` runs the GPU tests as if N GPUs were visible: with fewer, ranks share
them (src/hybridcomm/shared_gpu.py: our kernels run, time-sliced, on gloo process groups), and
tests that need NCCL skip. For kernel correctness on a machine with one GPU.
"""

import os
import shutil

import pytest
import torch
import torch.distributed as dist

from hybridcomm.spmd import SpmdPool


# --gpu-ranks, for this process and the workers it spawns (which compute their module-level worlds too)
GPU_RANKS_ENV = "HYBRIDCOMM_TEST_GPU_RANKS"


def pytest_addoption(parser):
    parser.addoption("--gpu-ranks", type=int, default=0,
                     help="run the GPU tests with this many ranks; more than the visible GPUs share them "
                          "(correctness only, no NCCL: src/hybridcomm/shared_gpu.py)")


def pytest_configure(config):
    ranks = config.getoption("--gpu-ranks")
    if ranks and not torch.cuda.is_available():
        raise pytest.UsageError("--gpu-ranks needs a CUDA GPU")
    if ranks:
        os.environ[GPU_RANKS_ENV] = str(ranks)


_pools: dict[tuple[int, str], SpmdPool] = {}  # (world size, device) -> the session's pool


@pytest.fixture(scope="session")
def pool():
    def get(world_size: int, device: str = "cpu") -> SpmdPool:
        key = (world_size, device)
        if key not in _pools or not _pools[key].alive:
            _pools[key] = SpmdPool(world_size, device, share_gpus=device == "cuda" and world_size > _visible_gpus())
        return _pools[key]

    yield get
    for p in _pools.values():
        p.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if report.when == "call" and report.failed:
        # Workers keep their communicators from test to test (check.communicator). After a failure
        # one may be broken (after a PeerTimeout it raises on every call), which would fail every
        # later test that uses it: the next test gets fresh workers instead.
        for p in _pools.values():
            p.close(kill=True)


def _visible_gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpu_count() -> int:
    """GPU ranks the GPU tests may spawn: the visible GPUs, or --gpu-ranks."""
    return int(os.environ.get(GPU_RANKS_ENV, 0)) or _visible_gpus()


GPU_WORLDS = (8, 4, 2)  # the worlds the GPU tests know layouts for, largest first


def gpu_world() -> int:
    """The world the GPU tests run: the largest of GPU_WORLDS that the GPU ranks fill (8 on an
    8-GPU node or with --gpu-ranks 8), else 2."""
    return next((w for w in GPU_WORLDS if gpu_count() >= w), GPU_WORLDS[-1])


def attention_layouts(world: int) -> list:
    """Every way attention can split `world` (experts over the whole world, moe_tp 1): the
    DP x TP mixes first, then pure DP, then pure TP (world 4: dp2xtp2, dp4, tp4)."""
    from hybridcomm import Layout

    mixed = [Layout(world, attn_tp=t) for t in range(2, world) if world % t == 0]
    return mixed + [Layout(world), Layout(world, attn_tp=world)]


def sharing_gpus() -> bool:
    return gpu_count() > _visible_gpus()


def needs_gpus(n: int):
    return pytest.mark.skipif(gpu_count() < n, reason=f"needs {n} CUDA GPUs, found {gpu_count()}")


def needs_nccl():
    """For tests that run NCCL (a backend or a baseline): not with ranks sharing GPUs."""
    return pytest.mark.skipif(sharing_gpus(), reason="needs NCCL; --gpu-ranks has ranks sharing GPUs (gloo)")


@pytest.fixture(scope="module")
def stub_lib():
    """For a module's tests of the GPU route on CPU (hybridcomm.bench.host): this process as rank 0
    of a fake world of 2, NvlinkBackend on stand-ins, launchers that return at once."""
    from hybridcomm.bench.host import fake_world, stand_ins, stub_library

    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler for the stub launchers")
    if dist.is_initialized():
        pytest.skip("torch.distributed already initialised in this process")
    library = stub_library()
    with fake_world(2), stand_ins(library):
        yield library
