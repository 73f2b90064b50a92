"""The host side of the in-kernel trace (csrc/trace.cuh): select the trace build, read its rings.

    from hybridcomm import build, trace
    build.variant = "trace"          # before the first Communicator: nvlink backends load this build
    trace.clear()
    ... run calls ...
    records = trace.read()           # numpy structured array, one row per traced kernel call

Only the trace build fills records (the normal build registers no ring: `trace.read()` raises).
Fields mirror TraceRecord: op, flag (the group's call number: the same call on every rank),
blocks, rank (index in the group), ns / cycles per event (EVENTS order; 0 = not passed), and
last_ns / last_cycles (the last block's end). scripts/latency_trace.py turns them into phases.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from . import build

# csrc/trace.cuh TraceEvent, in order; the record layout is checked against the library's size.
EVENTS = ("entry", "ready", "arrived", "sent", "refilled", "wait_begin", "wait_end", "end_begin", "arrivals",
          "counted", "exit")
RECORDS = 2048  # kTraceRecords
RECORD = np.dtype([("op", "<u4"), ("flag", "<u4"), ("blocks", "<u4"), ("rank", "<u4"),
                   ("ns", "<u8", (len(EVENTS),)), ("cycles", "<u8", (len(EVENTS),)),
                   ("last_ns", "<u8"), ("last_cycles", "<u8")])
RING_HEADER = 8  # calls, pad


def _lib() -> ctypes.CDLL:
    lib = build.load(build.device_arch())  # argument types: abi.SIGNATURES
    size = lib.hc_trace_ring_bytes()
    if size != RING_HEADER + RECORDS * RECORD.itemsize:
        raise RuntimeError(f"trace.py's record layout ({RING_HEADER + RECORDS * RECORD.itemsize} bytes per ring) "
                           f"differs from csrc/trace.cuh's ({size}): update RECORD / EVENTS")
    if lib.hc_trace_rings() == 0:
        raise RuntimeError("the loaded library records no trace: set hybridcomm.build.variant = 'trace' before "
                           "creating the first Communicator")
    return lib


def _check(name: str, status: int) -> None:
    if status:
        raise RuntimeError(f"hybridcomm trace: {name} failed with CUDA error {status}")


def clear() -> None:
    """Forget every record (on the current stream; waits for it)."""
    lib = _lib()
    _check("clear", lib.hc_trace_clear(ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)))
    torch.cuda.synchronize()


def read() -> np.ndarray:
    """Every record since the last clear(), each ring in call (flag) order, rings one after another."""
    lib = _lib()
    torch.cuda.synchronize()
    size = lib.hc_trace_ring_bytes()
    out = []
    for i in range(lib.hc_trace_rings()):
        buf = ctypes.create_string_buffer(size)
        _check("copy", lib.hc_trace_copy(i, buf, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)))
        torch.cuda.synchronize()
        calls = int(np.frombuffer(buf, "<u4", count=1)[0])
        if calls > RECORDS:
            raise RuntimeError(f"{calls} calls traced by one kernel file since clear(); its ring holds {RECORDS}")
        ring = np.frombuffer(buf, RECORD, count=RECORDS, offset=RING_HEADER)
        ring = ring[ring["ns"][:, EVENTS.index("ready")] != 0]  # the records written since clear()
        out.append(ring[np.argsort(ring["flag"], kind="stable")].copy())
    return np.concatenate(out) if out else np.zeros(0, RECORD)
