"""Our CUDA launchers as torch.library custom ops (namespace `hybridcomm`).

Each op takes a group handle (an index into the groups registered by nvlink backends)
plus tensors and plain ints; it allocates its output and launches on the current stream,
so it runs eagerly, inside CUDA graph capture, and as one opaque node under torch.compile
(fake implementations give the output shapes).
"""

from __future__ import annotations

import ctypes
import functools
import math

import torch

from .abi import DTYPE_CODE, MAX_RANKS, OTHER_DTYPE, GatherTokensAlgorithm, GroupArgs, LamportArgs
from .quant.formats import FORMATS

_groups: list[tuple[ctypes.CDLL, object]] = []  # handle -> (library, pointer to GroupArgs)
_lamport: list[object] = []  # handle -> pointer to LamportArgs
poison_outputs = False  # tests set this: new outputs start as NaN, so unwritten rows show


def register_group(lib: ctypes.CDLL, args: GroupArgs, lamport: LamportArgs) -> int:
    _groups.append((lib, ctypes.pointer(args)))
    _lamport.append(ctypes.pointer(lamport))
    return len(_groups) - 1


def release_group(handle: int) -> None:
    """Forget a handle's GroupArgs (its peer pointers die with the workspace). Handles are
    indices, so the slot stays (None): a stale handle then fails loudly, never reuses memory."""
    _groups[handle] = None
    _lamport[handle] = None


def _new(shape, like: torch.Tensor) -> torch.Tensor:
    if poison_outputs:
        return torch.full(shape, float("nan"), dtype=like.dtype, device=like.device)
    return torch.empty(shape, dtype=like.dtype, device=like.device)


def _launch(name: str, rc: int) -> None:
    if rc:
        raise RuntimeError(f"hybridcomm {name}: kernel launch failed with CUDA error {rc}")


def _stream(x: torch.Tensor) -> int:
    # the raw handle, without building a torch.cuda.Stream (nor a torch.device) object per call
    return torch._C._cuda_getCurrentRawStream(x.get_device())


_SizesArray = ctypes.c_int32 * MAX_RANKS  # built once: making the array type costs per call


def _sizes(sizes: torch.Tensor | None, host: list[int]):
    """(device pointer or None, inline int32 array or None) for a SizesArg."""
    if sizes is not None:
        return sizes.data_ptr(), None
    return None, _SizesArray(*host)


def _gather_sizes(sizes: torch.Tensor | None, host: list[int], own: torch.Tensor | None,
                  learned: torch.Tensor | None):
    """A gather's (sizes_device, sizes_host, own_count) pointers: the counts as given, or in
    own-count mode this rank's count alone and where the kernel writes every member's
    (csrc/own_count.cuh)."""
    if own is not None:
        return learned.data_ptr(), None, own.data_ptr()
    return _sizes(sizes, host) + (None,)


def _row_bytes(x: torch.Tensor) -> int:
    return math.prod(x.shape[1:]) * x.element_size()


_lib = torch.library.Library("hybridcomm", "DEF")

# Every op's last argument, pdl: launch overlapping the previous kernel (csrc/pdl.cuh).
# The gathers' `own` / `learned`: own-count mode (csrc/own_count.cuh): `own` holds this rank's
# count alone (sizes is then None) and the kernel writes every member's count into `learned`.
_lib.define("all_reduce(Tensor x, int group, int algorithm, bool pdl) -> Tensor")
_lib.define("all_gather_v(Tensor x, Tensor? sizes, int[] host_sizes, Tensor? own, Tensor(a!)? learned, int group, "
            "int out_rows, bool pdl) -> Tensor")
_lib.define("reduce_scatter_v(Tensor x, Tensor? sizes, int[] host_sizes, int group, int out_rows, bool pdl) -> Tensor")
_lib.define("gather_tokens(Tensor x, Tensor? sizes, int[] host_sizes, Tensor? own, Tensor(a!)? learned, int group, "
            "int tp, bool partial, int algorithm, int out_rows, bool pdl) -> Tensor")
_lib.define("gather_tokens_norm(Tensor x, Tensor? sizes, int[] host_sizes, Tensor? own, Tensor(a!)? learned, "
            "Tensor residual, Tensor weight, float eps, int group, int tp, bool partial, int out_rows, bool pdl) "
            "-> (Tensor, Tensor)")
_lib.define("scatter_tokens(Tensor y, Tensor? sizes, int[] host_sizes, int group, int tp, int algorithm, "
            "int out_rows, bool pdl) -> Tensor")
_lib.define("all_reduce_pipelined(Tensor x, int group, int chunk_bytes, int blocks, bool pdl) -> Tensor")
for _name in ("all_gather_v_pipelined", "reduce_scatter_v_pipelined"):
    _lib.define(f"{_name}(Tensor x, Tensor? sizes, int[] host_sizes, int group, int out_rows, int chunk_bytes, "
                "int blocks, bool pdl) -> Tensor")
_lib.define("quant_gather(Tensor x, Tensor? sizes, int[] host_sizes, Tensor? own, Tensor(a!)? learned, "
            "Tensor? residual, Tensor? weight, float eps, Tensor? global_scale, int group, int tp, bool partial, "
            "int op, int format, int out_rows, int algorithm, bool lamport, bool pdl) -> (Tensor, Tensor, Tensor)")


def all_reduce(x, group, algorithm, pdl):
    lib, args = _groups[group]
    out = _new(x.shape, x)
    _launch("all_reduce", lib.hc_all_reduce(args, algorithm, DTYPE_CODE[x.dtype], x.data_ptr(), out.data_ptr(),
                                            x.numel() * x.element_size(), int(pdl), _stream(x)))
    return out


def all_reduce_pipelined(x, group, chunk_bytes, blocks, pdl):
    """The pipelined two-shot (csrc/pipelined_all_reduce.cu); chunk_bytes, blocks: pipeline.py."""
    lib, args = _groups[group]
    out = _new(x.shape, x)
    _launch("all_reduce", lib.hc_all_reduce_pipelined(args, DTYPE_CODE[x.dtype], x.data_ptr(), out.data_ptr(),
                                                      x.numel() * x.element_size(), chunk_bytes, blocks, int(pdl),
                                                      _stream(x)))
    return out


def _pipelined_rows(op, x, sizes, host_sizes, group, out_rows, chunk_bytes, blocks, pdl):
    """A pipelined one-shot over rows (csrc/pipelined_<op>.cu); chunk_bytes, blocks: pipeline.py."""
    lib, args = _groups[group]
    out = _new((out_rows,) + tuple(x.shape[1:]), x)
    dev, host = _sizes(sizes, host_sizes)
    _launch(op, getattr(lib, f"hc_{op}_pipelined")(args, DTYPE_CODE[x.dtype], x.data_ptr(), out.data_ptr(), dev,
                                                   host, _row_bytes(x), x.shape[0], out_rows, chunk_bytes, blocks,
                                                   int(pdl), _stream(x)))
    return out


def all_gather_v_pipelined(x, sizes, host_sizes, group, out_rows, chunk_bytes, blocks, pdl):
    return _pipelined_rows("all_gather_v", x, sizes, host_sizes, group, out_rows, chunk_bytes, blocks, pdl)


def reduce_scatter_v_pipelined(x, sizes, host_sizes, group, out_rows, chunk_bytes, blocks, pdl):
    return _pipelined_rows("reduce_scatter_v", x, sizes, host_sizes, group, out_rows, chunk_bytes, blocks, pdl)


def all_gather_v(x, sizes, host_sizes, own, learned, group, out_rows, pdl):
    lib, args = _groups[group]
    out = _new((out_rows,) + tuple(x.shape[1:]), x)
    dev, host, mine = _gather_sizes(sizes, host_sizes, own, learned)
    dtype = DTYPE_CODE.get(x.dtype, OTHER_DTYPE)  # only compared across ranks: rows move as bytes
    _launch("all_gather_v", lib.hc_all_gather_v(args, dtype, x.data_ptr(), out.data_ptr(), dev, host, mine,
                                                _row_bytes(x), x.shape[0], out_rows, int(pdl), _stream(x)))
    return out


def reduce_scatter_v(x, sizes, host_sizes, group, out_rows, pdl):
    lib, args = _groups[group]
    out = _new((out_rows,) + tuple(x.shape[1:]), x)
    dev, host = _sizes(sizes, host_sizes)
    _launch("reduce_scatter_v", lib.hc_reduce_scatter_v(args, DTYPE_CODE[x.dtype], x.data_ptr(), out.data_ptr(),
                                                        dev, host, _row_bytes(x), x.shape[0], out_rows,
                                                        int(pdl), _stream(x)))
    return out


def gather_tokens(x, sizes, host_sizes, own, learned, group, tp, partial, algorithm, out_rows, pdl):
    lib, args = _groups[group]
    out = _new((out_rows,) + tuple(x.shape[1:]), x)
    dev, host, mine = _gather_sizes(sizes, host_sizes, own, learned)
    _launch("gather_tokens", lib.hc_gather_tokens(args, algorithm, DTYPE_CODE[x.dtype], tp, int(partial),
                                                  x.data_ptr(), out.data_ptr(), None, None, None, 0.0, dev, host,
                                                  mine, _row_bytes(x), x.shape[0], out_rows, int(pdl), _stream(x)))
    return out


def gather_tokens_norm(x, sizes, host_sizes, own, learned, residual, weight, eps, group, tp, partial, out_rows, pdl):
    lib, args = _groups[group]
    launcher = functools.partial(lib.hc_gather_tokens, args, GatherTokensAlgorithm.FUSED)
    return _launch_fused_gather(launcher, x, sizes, host_sizes, own, learned, residual, weight, eps, tp, partial,
                                out_rows, pdl)


def lamport_gather_tokens_norm(x, sizes, host_sizes, own, learned, residual, weight, eps, group, tp, partial,
                               out_rows, pdl):
    """gather_tokens_norm on the Lamport protocol (csrc/lamport_fused_tokens.cu): hidden at most
    abi.MAX_QUANT_HIDDEN (the caller checks)."""
    lib, args = _groups[group]
    launcher = functools.partial(lib.hc_lamport_gather_tokens_norm, args, _lamport[group])
    return _launch_fused_gather(launcher, x, sizes, host_sizes, own, learned, residual, weight, eps, tp, partial,
                                out_rows, pdl)


def _launch_fused_gather(launcher, x, sizes, host_sizes, own, learned, residual, weight, eps, tp, partial, out_rows,
                         pdl):
    """A fused gather's launch: launcher(dtype, tp, partial, in, out, residual, weight, residual_out, eps,
    counts..., row_bytes, in_rows, out_rows, pdl, stream); returns (out, residual_out)."""
    out = _new((out_rows,) + tuple(x.shape[1:]), x)
    residual_out = _new(residual.shape, x)
    dev, host, mine = _gather_sizes(sizes, host_sizes, own, learned)
    _launch("gather_tokens", launcher(DTYPE_CODE[x.dtype], tp, int(partial), x.data_ptr(), out.data_ptr(),
                                      residual.data_ptr(), weight.data_ptr(), residual_out.data_ptr(), eps, dev, host,
                                      mine, _row_bytes(x), x.shape[0], out_rows, int(pdl), _stream(x)))
    return out, residual_out


def scatter_tokens(y, sizes, host_sizes, group, tp, algorithm, out_rows, pdl):
    lib, args = _groups[group]
    out = _new((out_rows,) + tuple(y.shape[1:]), y)
    dev, host = _sizes(sizes, host_sizes)
    _launch("scatter_tokens", lib.hc_scatter_tokens(args, algorithm, DTYPE_CODE[y.dtype], tp, y.data_ptr(),
                                                    out.data_ptr(), dev, host, _row_bytes(y), y.shape[0], out_rows,
                                                    int(pdl), _stream(y)))
    return out


def _quant_outputs(x, format, out_rows):
    """Empty (data, scales) of `out_rows` quantized rows (hybridcomm.quant.formats)."""
    spec = next(f for f in FORMATS.values() if f.code == format)
    hidden = x.shape[1]
    data = x.new_empty((out_rows, spec.data_cols(hidden)), dtype=spec.data_dtype)
    scales = x.new_empty((out_rows, spec.scale_cols(hidden)), dtype=spec.scale_dtype)
    if poison_outputs:  # 0x7f bytes: NaN in e4m3
        data.view(torch.uint8).fill_(0x7F)
        scales.view(torch.uint8).fill_(0x7F)
    return data, scales


def quant_gather(x, sizes, host_sizes, own, learned, residual, weight, eps, global_scale, group, tp, partial, op,
                 format, out_rows, algorithm, lamport, pdl):
    """gather_tokens / all_gather_v with quantized rows (csrc/quant_gather.cu on LL packets, or
    with `lamport` csrc/lamport_quant_gather.cu on the group's Lamport areas; `algorithm`: an
    abi.QuantGatherAlgorithm); returns (data, scales, residual_out), residual_out empty unless
    residual is given."""
    lib, args = _groups[group]
    data, scales = _quant_outputs(x, format, out_rows)
    residual_out = _new(residual.shape, x) if residual is not None else x.new_empty((0,))
    dev, host, mine = _gather_sizes(sizes, host_sizes, own, learned)
    ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
    launcher = functools.partial(lib.hc_lamport_quant_gather, args, _lamport[group]) if lamport else \
        functools.partial(lib.hc_quant_gather, args)
    _launch("quant_gather", launcher(
        algorithm, format, DTYPE_CODE[x.dtype], tp, int(partial), op, x.data_ptr(), ptr(residual), ptr(weight),
        residual_out.data_ptr() if residual is not None else None, eps, ptr(global_scale),
        data.data_ptr(), scales.data_ptr(), dev, host, mine, x.shape[1], x.shape[0], out_rows, int(pdl), _stream(x)))
    return data, scales, residual_out


# -- Lamport protocol (csrc/lamport.cuh)
_lib.define("lamport_all_reduce(Tensor x, int group, bool pdl) -> Tensor")
_lib.define("lamport_all_gather_v(Tensor x, Tensor? sizes, int[] host_sizes, Tensor? own, Tensor(a!)? learned, "
            "int group, int out_rows, bool pdl) -> Tensor")
_lib.define("lamport_reduce_scatter_v(Tensor x, Tensor? sizes, int[] host_sizes, int group, int out_rows, "
            "bool pdl) -> Tensor")
_lib.define("lamport_gather_tokens(Tensor x, Tensor? sizes, int[] host_sizes, Tensor? own, Tensor(a!)? learned, "
            "int group, int tp, int out_rows, bool pdl) -> Tensor")
_lib.define("lamport_scatter_tokens(Tensor y, Tensor? sizes, int[] host_sizes, int group, int tp, int out_rows, "
            "bool pdl) -> Tensor")
_lib.define("lamport_gather_tokens_norm(Tensor x, Tensor? sizes, int[] host_sizes, Tensor? own, "
            "Tensor(a!)? learned, Tensor residual, Tensor weight, float eps, int group, int tp, bool partial, "
            "int out_rows, bool pdl) -> (Tensor, Tensor)")


def lamport_all_reduce(x, group, pdl):
    lib, args = _groups[group]
    out = _new(x.shape, x)
    _launch("all_reduce", lib.hc_lamport_all_reduce(args, _lamport[group], DTYPE_CODE[x.dtype], x.data_ptr(),
                                                    out.data_ptr(), x.numel() * x.element_size(), int(pdl),
                                                    _stream(x)))
    return out


def _lamport_rows(name, fn, x, size_args, group, out_rows, pdl, *tp):
    """Launch a Lamport kernel over rows; `size_args`: its pointers for the counts (_sizes, or a
    gather's _gather_sizes); `tp` (the transitions' attn-TP size) goes after dtype."""
    lib, args = _groups[group]
    out = _new((out_rows,) + tuple(x.shape[1:]), x)
    _launch(name, getattr(lib, fn)(args, _lamport[group], DTYPE_CODE[x.dtype], *tp, x.data_ptr(), out.data_ptr(),
                                   *size_args, _row_bytes(x), x.shape[0], out_rows, int(pdl), _stream(x)))
    return out


def lamport_all_gather_v(x, sizes, host_sizes, own, learned, group, out_rows, pdl):
    return _lamport_rows("all_gather_v", "hc_lamport_all_gather_v", x, _gather_sizes(sizes, host_sizes, own, learned),
                         group, out_rows, pdl)


def lamport_reduce_scatter_v(x, sizes, host_sizes, group, out_rows, pdl):
    return _lamport_rows("reduce_scatter_v", "hc_lamport_reduce_scatter_v", x, _sizes(sizes, host_sizes), group,
                         out_rows, pdl)


def lamport_gather_tokens(x, sizes, host_sizes, own, learned, group, tp, out_rows, pdl):
    return _lamport_rows("gather_tokens", "hc_lamport_gather_tokens", x, _gather_sizes(sizes, host_sizes, own, learned),
                         group, out_rows, pdl, tp)


def lamport_scatter_tokens(y, sizes, host_sizes, group, tp, out_rows, pdl):
    return _lamport_rows("scatter_tokens", "hc_lamport_scatter_tokens", y, _sizes(sizes, host_sizes), group, out_rows,
                         pdl, tp)


IMPLS = {"quant_gather": quant_gather, "all_reduce": all_reduce, "all_reduce_pipelined": all_reduce_pipelined,
         "all_gather_v_pipelined": all_gather_v_pipelined, "reduce_scatter_v_pipelined": reduce_scatter_v_pipelined,
         "all_gather_v": all_gather_v,
         "reduce_scatter_v": reduce_scatter_v, "gather_tokens": gather_tokens,
         "gather_tokens_norm": gather_tokens_norm, "scatter_tokens": scatter_tokens,
         "lamport_all_reduce": lamport_all_reduce, "lamport_all_gather_v": lamport_all_gather_v,
         "lamport_reduce_scatter_v": lamport_reduce_scatter_v, "lamport_gather_tokens": lamport_gather_tokens,
         "lamport_scatter_tokens": lamport_scatter_tokens, "lamport_gather_tokens_norm": lamport_gather_tokens_norm}
for _name, _fn in IMPLS.items():
    _lib.impl(_name, _fn, "CUDA")


def call(name: str, *args):
    """Run op `name`: through torch.ops while torch.compile traces (one opaque node), else the
    launcher directly. A Python-implemented custom op costs a dispatcher round trip per call
    (measured on a CPU op of the same signature: ~146 µs through torch.ops vs ~2 µs direct on
    the development machine), which eager decode steps pay on every transition."""
    if torch.compiler.is_compiling():
        return getattr(torch.ops.hybridcomm, name)(*args)
    return IMPLS[name](*args)


def _fake_rows(x, out_rows):
    return x.new_empty((out_rows,) + tuple(x.shape[1:]))


def add_rms_norm(reduced: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """norm.add_rms_norm in one kernel (csrc/add_rms_norm.cu): contiguous (rows, hidden) CUDA
    tensors and a (hidden,) weight, all of one dtype, rows of whole 8-byte lanes (the caller
    checks: add_rms_norm_fits). residual_out is bit for bit norm.py's; normed may differ from
    it in the last place in 16 bits, by a few units in fp32 (another summation order). Returns
    (normed, residual_out); normed goes into `out` when given. No communication, hence no
    group, and no PDL."""
    # (torch.empty, not empty_like: the same contiguous tensors, without empty_like's layout logic)
    normed = out if out is not None else torch.empty(residual.shape, dtype=residual.dtype, device=residual.device)
    residual_out = torch.empty(residual.shape, dtype=residual.dtype, device=residual.device)
    rc = _library().hc_add_rms_norm(DTYPE_CODE[residual.dtype], reduced.data_ptr(), residual.data_ptr(),
                                    weight.data_ptr(), float(eps), normed.data_ptr(), residual_out.data_ptr(),
                                    residual.shape[0], _row_bytes(residual), _stream(residual))
    _launch("add_rms_norm", rc)
    return normed, residual_out


@functools.cache
def _library() -> ctypes.CDLL:
    """The kernel library of this GPU, for launchers that belong to no group (loaded once)."""
    from . import build

    return build.load(build.device_arch())


def add_rms_norm_fits(reduced: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                      out: torch.Tensor | None = None) -> bool:
    """Whether add_rms_norm's kernel takes these tensors."""
    tensors = [reduced, residual, weight] + ([out] if out is not None else [])
    return (residual.is_cuda and residual.dim() == 2 and residual.dtype in DTYPE_CODE
            and all(t.dtype == residual.dtype and t.is_contiguous() and t.device == residual.device for t in tensors)
            and reduced.shape == residual.shape and (out is None or out.shape == residual.shape)
            and weight.shape == residual.shape[1:] and _row_bytes(residual) % 8 == 0)


torch.library.register_fake("hybridcomm::all_reduce")(lambda x, group, algorithm, pdl: torch.empty_like(x))
torch.library.register_fake("hybridcomm::all_reduce_pipelined")(
    lambda x, group, chunk, blocks, pdl: torch.empty_like(x))
for _name in ("all_gather_v_pipelined", "reduce_scatter_v_pipelined"):
    torch.library.register_fake(f"hybridcomm::{_name}")(
        lambda x, s, h, g, out_rows, chunk, blocks, pdl: _fake_rows(x, out_rows))
torch.library.register_fake("hybridcomm::all_gather_v")(
    lambda x, s, h, own, learned, g, out_rows, pdl: _fake_rows(x, out_rows))
torch.library.register_fake("hybridcomm::reduce_scatter_v")(lambda x, s, h, g, out_rows, pdl: _fake_rows(x, out_rows))
torch.library.register_fake("hybridcomm::gather_tokens")(
    lambda x, s, h, own, learned, g, tp, p, a, out_rows, pdl: _fake_rows(x, out_rows))
for _name in ("gather_tokens_norm", "lamport_gather_tokens_norm"):
    torch.library.register_fake(f"hybridcomm::{_name}")(
        lambda x, s, h, own, learned, r, w, e, g, tp, p, out_rows, pdl: (_fake_rows(x, out_rows), torch.empty_like(r)))
torch.library.register_fake("hybridcomm::quant_gather")(
    lambda x, s, h, own, learned, r, w, e, gs, g, tp, p, op, format, out_rows, algorithm, lamport, pdl:
    _quant_outputs(x, format, out_rows)
    + ((torch.empty_like(r) if r is not None else x.new_empty((0,))),))
torch.library.register_fake("hybridcomm::scatter_tokens")(
    lambda y, s, h, g, tp, a, out_rows, pdl: _fake_rows(y, out_rows))
torch.library.register_fake("hybridcomm::lamport_all_reduce")(lambda x, group, pdl: torch.empty_like(x))
torch.library.register_fake("hybridcomm::lamport_reduce_scatter_v")(
    lambda x, s, h, g, out_rows, pdl: _fake_rows(x, out_rows))
torch.library.register_fake("hybridcomm::lamport_scatter_tokens")(
    lambda x, s, h, g, tp, out_rows, pdl: _fake_rows(x, out_rows))
torch.library.register_fake("hybridcomm::lamport_all_gather_v")(
    lambda x, s, h, own, learned, g, out_rows, pdl: _fake_rows(x, out_rows))
torch.library.register_fake("hybridcomm::lamport_gather_tokens")(
    lambda x, s, h, own, learned, g, tp, out_rows, pdl: _fake_rows(x, out_rows))
