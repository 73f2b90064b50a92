"""Our CUDA launchers as torch.library custom ops (namespace `hybridcomm`).

Each op takes a group handle (an index into the groups registered by nvlink backends)
plus tensors and plain ints; it allocates its output and launches on the current stream,
so it runs eagerly, inside CUDA graph capture, and as one opaque node under torch.compile
(fake implementations give the output shapes).
"""

from __future__ import annotations

import ctypes
import math

import torch

from .abi import DTYPE_CODE, MAX_RANKS, OTHER_DTYPE, GatherTokensAlgorithm, GroupArgs

_groups: list[tuple[ctypes.CDLL, object]] = []  # handle -> (library, pointer to GroupArgs)
poison_outputs = False  # tests set this: new outputs start as NaN, so unwritten rows show


def register_group(lib: ctypes.CDLL, args: GroupArgs) -> int:
    _groups.append((lib, ctypes.pointer(args)))
    return len(_groups) - 1


def release_group(handle: int) -> None:
    """Forget a handle's GroupArgs (its peer pointers die with the workspace). Handles are
    indices, so the slot stays (None): a stale handle then fails loudly, never reuses memory."""
    _groups[handle] = None


def _new(shape, like: torch.Tensor) -> torch.Tensor:
    if poison_outputs:
        return torch.full(shape, float("nan"), dtype=like.dtype, device=like.device)
    return torch.empty(shape, dtype=like.dtype, device=like.device)


def _launch(name: str, rc: int) -> None:
    if rc:
        raise RuntimeError(f"hybridcomm {name}: kernel launch failed with CUDA error {rc}")


def _stream(x: torch.Tensor) -> int:
    return torch.cuda.current_stream(x.device).cuda_stream


def _sizes(sizes: torch.Tensor | None, host: list[int]):
    """(device pointer or None, inline int32 array or None) for a SizesArg."""
    if sizes is not None:
        return sizes.data_ptr(), None
    return None, (ctypes.c_int32 * MAX_RANKS)(*host)


def _row_bytes(x: torch.Tensor) -> int:
    return math.prod(x.shape[1:]) * x.element_size()


_lib = torch.library.Library("hybridcomm", "DEF")

_lib.define("all_reduce(Tensor x, int group, int algorithm) -> Tensor")
_lib.define("all_gather_v(Tensor x, Tensor? sizes, int[] host_sizes, int group, int out_rows) -> Tensor")
_lib.define("reduce_scatter_v(Tensor x, Tensor? sizes, int[] host_sizes, int group, int out_rows) -> Tensor")
_lib.define("gather_tokens(Tensor x, Tensor? sizes, int[] host_sizes, int group, int tp, bool partial, "
            "int algorithm, int out_rows) -> Tensor")
_lib.define("gather_tokens_norm(Tensor x, Tensor? sizes, int[] host_sizes, Tensor residual, Tensor weight, "
            "float eps, int group, int tp, bool partial, int out_rows) -> (Tensor, Tensor)")
_lib.define("scatter_tokens(Tensor y, Tensor? sizes, int[] host_sizes, int group, int tp, int algorithm, "
            "int out_rows) -> Tensor")


def all_reduce(x, group, algorithm):
    lib, args = _groups[group]
    out = _new(x.shape, x)
    _launch("all_reduce", lib.hc_all_reduce(args, algorithm, DTYPE_CODE[x.dtype], x.data_ptr(), out.data_ptr(),
                                            x.numel() * x.element_size(), _stream(x)))
    return out


def all_gather_v(x, sizes, host_sizes, group, out_rows):
    lib, args = _groups[group]
    out = _new((out_rows,) + tuple(x.shape[1:]), x)
    dev, host = _sizes(sizes, host_sizes)
    dtype = DTYPE_CODE.get(x.dtype, OTHER_DTYPE)  # only compared across ranks: rows move as bytes
    _launch("all_gather_v", lib.hc_all_gather_v(args, dtype, x.data_ptr(), out.data_ptr(), dev, host, _row_bytes(x),
                                                x.shape[0], out_rows, _stream(x)))
    return out


def reduce_scatter_v(x, sizes, host_sizes, group, out_rows):
    lib, args = _groups[group]
    out = _new((out_rows,) + tuple(x.shape[1:]), x)
    dev, host = _sizes(sizes, host_sizes)
    _launch("reduce_scatter_v", lib.hc_reduce_scatter_v(args, DTYPE_CODE[x.dtype], x.data_ptr(), out.data_ptr(),
                                                        dev, host, _row_bytes(x), x.shape[0], out_rows,
                                                        _stream(x)))
    return out


def gather_tokens(x, sizes, host_sizes, group, tp, partial, algorithm, out_rows):
    lib, args = _groups[group]
    out = _new((out_rows,) + tuple(x.shape[1:]), x)
    dev, host = _sizes(sizes, host_sizes)
    _launch("gather_tokens", lib.hc_gather_tokens(args, algorithm, DTYPE_CODE[x.dtype], tp, int(partial),
                                                  x.data_ptr(), out.data_ptr(), None, None, None, 0.0, dev, host,
                                                  _row_bytes(x), x.shape[0], out_rows, _stream(x)))
    return out


def gather_tokens_norm(x, sizes, host_sizes, residual, weight, eps, group, tp, partial, out_rows):
    lib, args = _groups[group]
    out = _new((out_rows,) + tuple(x.shape[1:]), x)
    residual_out = _new(residual.shape, x)
    dev, host = _sizes(sizes, host_sizes)
    _launch("gather_tokens", lib.hc_gather_tokens(args, GatherTokensAlgorithm.FUSED, DTYPE_CODE[x.dtype], tp,
                                                  int(partial), x.data_ptr(), out.data_ptr(), residual.data_ptr(),
                                                  weight.data_ptr(), residual_out.data_ptr(), eps, dev, host,
                                                  _row_bytes(x), x.shape[0], out_rows, _stream(x)))
    return out, residual_out


def scatter_tokens(y, sizes, host_sizes, group, tp, algorithm, out_rows):
    lib, args = _groups[group]
    out = _new((out_rows,) + tuple(y.shape[1:]), y)
    dev, host = _sizes(sizes, host_sizes)
    _launch("scatter_tokens", lib.hc_scatter_tokens(args, algorithm, DTYPE_CODE[y.dtype], tp, y.data_ptr(),
                                                    out.data_ptr(), dev, host, _row_bytes(y), y.shape[0], out_rows,
                                                    _stream(y)))
    return out


for _name, _fn in [("all_reduce", all_reduce), ("all_gather_v", all_gather_v),
                   ("reduce_scatter_v", reduce_scatter_v), ("gather_tokens", gather_tokens),
                   ("gather_tokens_norm", gather_tokens_norm), ("scatter_tokens", scatter_tokens)]:
    _lib.impl(_name, _fn, "CUDA")


def _fake_rows(x, out_rows):
    return x.new_empty((out_rows,) + tuple(x.shape[1:]))


torch.library.register_fake("hybridcomm::all_reduce")(lambda x, group, algorithm: torch.empty_like(x))
torch.library.register_fake("hybridcomm::all_gather_v")(lambda x, s, h, g, out_rows: _fake_rows(x, out_rows))
torch.library.register_fake("hybridcomm::reduce_scatter_v")(lambda x, s, h, g, out_rows: _fake_rows(x, out_rows))
torch.library.register_fake("hybridcomm::gather_tokens")(
    lambda x, s, h, g, tp, p, a, out_rows: _fake_rows(x, out_rows))
torch.library.register_fake("hybridcomm::gather_tokens_norm")(
    lambda x, s, h, r, w, e, g, tp, p, out_rows: (_fake_rows(x, out_rows), torch.empty_like(r)))
torch.library.register_fake("hybridcomm::scatter_tokens")(
    lambda y, s, h, g, tp, a, out_rows: _fake_rows(y, out_rows))
