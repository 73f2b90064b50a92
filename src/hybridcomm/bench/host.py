"""Host cost of eager calls on a machine without GPUs: the GPU route's Python path (checks,
selection, nvlink backend, launcher arguments through ctypes) with the kernel launchers
replaced by C functions that return at once.

How it stands in for a GPU (`stand_ins`, `gpu_route_communicator`): torch.distributed's "fake"
process group (no peers), tensors on the "meta" device (the communicator's device is set to it,
so the checks pass and the CPU shortcut to the reference backend is not taken), a stand-in
workspace (no memory; its error word is a host array read as on the GPU path) and a library of
no-op `hc_*` functions with the launchers' exact C signatures (abi.SIGNATURES), compiled with
the system C compiler. Left out: the CUDA driver's launch (cudaLaunchKernelEx) and the CUDA
caching allocator (torch.empty on CUDA costs more than on meta), so a GPU call's host cost is
this plus a few µs. Used by scripts/host_cost.py and the selection tests.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import statistics
import subprocess
import tempfile
import time

import numpy as np
import torch

from ..abi import decode_error

C_TYPES = {ctypes.c_void_p: "void*", ctypes.c_int: "int", ctypes.c_int64: "long long", ctypes.c_float: "float"}


def stub_library() -> ctypes.CDLL:
    """A shared library with every launcher of abi.SIGNATURES as a C function returning 0."""
    from .. import abi

    lines = []
    for name, argtypes in abi.SIGNATURES.items():
        params = ", ".join(f"{C_TYPES.get(t, 'void*')} a{i}" for i, t in enumerate(argtypes))
        lines.append(f"int {name}({params}) {{ return 0; }}")
    folder = tempfile.mkdtemp(prefix="hc_stub_")
    src, lib_path = os.path.join(folder, "stub.c"), os.path.join(folder, "libstub.so")
    with open(src, "w") as f:
        f.write("\n".join(lines) + "\n")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", lib_path, src], check=True)
    lib = ctypes.CDLL(lib_path)
    for name, argtypes in abi.SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, ctypes.c_int
    return lib


class StandInWorkspace:
    """What NvlinkBackend reads of a Workspace: GroupArgs / LamportArgs per group of two or
    more ranks, no blocker, and an error word that reads 0."""

    def __init__(self, layout, groups, device, area_bytes, timeout_s, chunked=True, max_sms=None):
        from ..abi import GroupArgs, LamportArgs
        from ..workspace import region_groups

        self.area_bytes, self.layout, self.chunked = area_bytes, layout, chunked
        self.keys, self.blocker = region_groups(layout)
        self.args = {name: GroupArgs(nranks=groups[name].size, me=groups[name].index) for name in self.keys}
        self.lamport_args = {name: LamportArgs() for name in self.keys}
        self._error_view = np.zeros(1, dtype=np.int64)

    def recorded_error(self):
        word = int(self._error_view[0])
        return decode_error(word) if word else None

    def close(self):
        self.args, self.lamport_args, self.blocker = {}, {}, "the communicator was closed"


@contextlib.contextmanager
def fake_world(size: int = 2):
    """torch.distributed initialised in this process as rank 0 of `size` on the "fake" backend
    (collectives return at once), torn down on exit."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=size)
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def stand_ins(lib: ctypes.CDLL | None):
    """Inside: NvlinkBackend builds on a StandInWorkspace and `lib`, launchers take stream 0
    (a CPU build of torch has no CUDA stream; on a GPU the raw-handle lookup is one C call),
    and the engines' one-kernel norm (backends.nccl.engine_add_rms_norm) launches `lib`'s
    add_rms_norm on meta tensors as it would on CUDA ones."""
    from .. import build, kernels
    from ..backends import nccl, nvlink

    saved = (nvlink.Workspace, build.load, build.device_arch, kernels._stream, kernels._library,
             kernels.add_rms_norm_fits, nccl._kernel_library_built)
    nvlink.Workspace, kernels._stream = StandInWorkspace, (lambda x: 0)
    build.load, build.device_arch = (lambda arch=None: lib), (lambda: "stub")
    kernels._library, kernels.add_rms_norm_fits = (lambda: lib), (lambda *tensors: True)
    nccl._kernel_library_built = lambda: True
    try:
        yield
    finally:
        (nvlink.Workspace, build.load, build.device_arch, kernels._stream, kernels._library,
         kernels.add_rms_norm_fits, nccl._kernel_library_built) = saved


def gpu_route_communicator(layout, lib: ctypes.CDLL | None):
    """A Communicator (of this process's rank; torch.distributed initialised) that takes the
    GPU route, nvlink backend included, with meta tensors. Build and use it inside `stand_ins`."""
    from ..backends.nvlink import NvlinkBackend
    from ..communicator import Communicator

    comm = Communicator(layout, device="cpu")
    comm.device = torch.device("meta")
    comm.backends["nvlink"] = NvlinkBackend(comm)
    return comm


def host_us(calls: dict, n: int, rounds: int) -> dict:
    """op -> {"median", "min"} over rounds of the µs per call of n back-to-back calls (ops
    interleaved within each round, so a load spike on the machine hits all of them). Timed in
    this thread's CPU time, not wall clock: on a shared machine the time spent descheduled is
    not the call's; what load still adds (caches, a shared core) only ever adds, so the best
    round is the steadier figure."""
    for call in calls.values():  # warm up (and fail early)
        for _ in range(50):
            call()
    per_round = {op: [] for op in calls}
    for _ in range(rounds):
        for op, call in calls.items():
            start = time.thread_time()
            for _ in range(n):
                call()
            per_round[op].append((time.thread_time() - start) * 1e6 / n)
    return {op: {"median": statistics.median(v), "min": min(v)} for op, v in per_round.items()}
