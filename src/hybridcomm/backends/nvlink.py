"""Our kernels: unicast pushes over NVLink into peers' symmetric memory (see csrc/).

The backend owns the workspace, says per call whether a kernel can run it (`blocker`), and
calls the custom ops of hybridcomm.kernels. Semantics are the reference's, bit for bit
(fp32 sums in group order), except the fused RMSNorm, whose hidden-dimension sum uses a
different tree (within one rounding of the reference).
"""

from __future__ import annotations

import functools
import math

import torch

from .. import algorithms, build, kernels
from ..abi import DTYPE_CODE, MAX_QUANT_HIDDEN, ROW_ALIGN_BYTES, CallField, ErrorCode, OpCode
from ..arguments import Sizes, result_rows
from ..errors import ArgumentMismatch, CapacityExceeded, PeerTimeout
from ..groups import Group
from ..layout import GROUP_NAMES
from ..ops import CHUNKED, FUSED_LAMPORT, LAMPORT, LL, OPS, QUANT_LOCAL, Protocol, op_name, reduced
from ..pipeline import PipelineParams, params_for
from ..quant import QuantizedRows
from ..two_step import TwoStep
from ..workspace import DEFAULT_AREA_BYTES, Workspace

PDL = True  # default launch option: overlap each kernel's launch with the kernel before it (csrc/pdl.cuh)


class NvlinkBackend:
    name = "nvlink"

    def __init__(self, comm, workspace_bytes: int | None = None, pdl: bool = PDL, max_sms: int | None = None):
        self.layout, self.groups, self.timeout_s = comm.layout, comm.groups, comm.timeout_s
        self.pdl = pdl  # passed with every launch: the one place it is set (tests run both)
        self.workspace = Workspace(comm.layout, comm.groups, comm.device, workspace_bytes or DEFAULT_AREA_BYTES,
                                   comm.timeout_s, chunked=algorithms.picks_protocol(comm.tables, CHUNKED),
                                   max_sms=max_sms)
        self.two_step = TwoStep(comm)  # the composed algorithm: two of comm's own ops
        self.handles: dict[str, int] = {}
        # The pipelined two-shot's chunk size and blocks: None = pipeline.PIPELINE_TABLE by size.
        self.pipeline: PipelineParams | None = None
        if self.workspace.args:
            lib = build.load(build.device_arch())
            self.handles = {name: kernels.register_group(lib, args, self.workspace.lamport_args[name])
                            for name, args in self.workspace.args.items()}

    # -- can a kernel run this call? ---------------------------------------------------------
    def blocker(self, op: str, algorithm: str, group: Group, x: torch.Tensor, sizes: Sizes | None) -> str | None:
        """Why our kernel cannot run this call, or None (ops.OPS says what the op sends)."""
        if self.workspace.blocker:
            return self.workspace.blocker
        if group.name not in self.handles:
            return f"group {group.name!r} has one rank: nothing to communicate"
        spec = OPS[op]
        if spec.quantized and (x.dim() != 2 or x.shape[1] % 16 or x.shape[1] > MAX_QUANT_HIDDEN):
            return (f"quantized rows of shape {tuple(x.shape[1:])}: the kernel takes a hidden size that is a "
                    f"multiple of 16, at most {MAX_QUANT_HIDDEN}")
        alg = spec.algorithm(algorithm)
        if alg.composed:
            return None  # each step is selected (and checked, or sent to NCCL) on its own
        if alg.protocol is CHUNKED and not self.workspace.chunked:
            return ("this workspace has no chunked areas: the Communicator's table picked no pipelined "
                    "algorithm when it was created")
        if alg.protocol in (LAMPORT, CHUNKED) and x.dtype not in DTYPE_CODE:
            return f"the {alg.protocol.name} protocol carries {sorted(map(str, DTYPE_CODE))} only (got {x.dtype})"
        if spec.shape == "flat":
            nbytes = x.numel() * x.element_size()
            if nbytes % ROW_ALIGN_BYTES:
                return f"{nbytes} bytes is not a multiple of {ROW_ALIGN_BYTES}"
        else:
            row_bytes = math.prod(x.shape[1:]) * x.element_size()
            if row_bytes % ROW_ALIGN_BYTES:
                return f"rows of {row_bytes} bytes are not a multiple of {ROW_ALIGN_BYTES}"
            nbytes = (max(sizes.host) if sizes.host is not None else x.shape[0]) * row_bytes
        per_peer = spec.per_peer_bytes(alg, nbytes, group.size)
        capacity = self._bounding_protocol(spec, alg).capacity(self.workspace.area_bytes)
        if per_peer > capacity and not alg.sliced:
            return (f"{op}/{algorithm} sends {per_peer} bytes to a peer; the workspace takes "
                    f"{capacity} (raise workspace_bytes)")
        return None

    def _bounding_protocol(self, spec, alg) -> Protocol:
        """The protocol whose areas bound the call: the algorithm's, except for the quantized
        gathers' partial rows (gather_tokens with attention TP > 1), which reach their owner on
        LL in both kernels, and the LL kernel, which checks its areas for the unquantized row
        width (csrc/quant_gather.cu). Their wire rows are smaller than the unquantized ones
        counted here, so the Lamport kernel's DP rows fit whenever these do. quant_local and
        fused_lamport: LL too (their rows fill half as much of their Lamport areas; the calls they
        hand to the LL kernel, _quant_gather / _fused_gather, need the LL bound)."""
        if alg is FUSED_LAMPORT:
            return LL
        if not spec.quantized or alg.protocol is LAMPORT and alg is not QUANT_LOCAL and not (
                spec.name == "gather_tokens_quant" and self.layout.attn_tp > 1):
            return alg.protocol
        return LL

    # -- ops ---------------------------------------------------------------------------------
    def all_reduce(self, x, group: Group, algorithm):
        if _is_lamport("all_reduce", algorithm):
            return kernels.call("lamport_all_reduce", x, self.handles[group.name], self.pdl)
        if _protocol("all_reduce", algorithm) is CHUNKED:
            p = self._pipeline(x.numel() * x.element_size())
            return kernels.call("all_reduce_pipelined", x, self.handles[group.name], p.chunk_bytes, p.blocks, self.pdl)
        return kernels.call("all_reduce", x, self.handles[group.name], _code("all_reduce", algorithm), self.pdl)

    def all_gather_v(self, x, sizes: Sizes, group: Group, algorithm, quant=None):
        out_rows = result_rows(sizes, group.index, x.shape[0], gathered=True)
        if quant is not None:
            return self._quant_gather(x, sizes, group, 1, True, None, quant, OpCode.ALL_GATHER_V, out_rows,
                                      "all_gather_v_quant", algorithm)
        if _protocol("all_gather_v", algorithm) is CHUNKED:
            return self._pipelined_rows("all_gather_v", x, sizes, group, out_rows, out_rows)
        name = "lamport_all_gather_v" if _is_lamport("all_gather_v", algorithm) else "all_gather_v"
        return kernels.call(name, x, *_gather_sizes(sizes), self.handles[group.name], out_rows, self.pdl)

    def _pipeline(self, nbytes: int) -> PipelineParams:
        """The pipelined algorithms' chunk size and blocks: the override, else by message size."""
        return self.pipeline or params_for(nbytes)

    def _pipelined_rows(self, op: str, x, sizes: Sizes, group: Group, out_rows: int, message_rows: int):
        """A pipelined one-shot over rows; message_rows: the rows of the op's message tensor."""
        p = self._pipeline(message_rows * math.prod(x.shape[1:]) * x.element_size())
        return kernels.call(f"{op}_pipelined", x, sizes.device, list(sizes.host or ()), self.handles[group.name],
                            out_rows, p.chunk_bytes, p.blocks, self.pdl)

    def reduce_scatter_v(self, x, sizes: Sizes, group: Group, algorithm):
        out_rows = result_rows(sizes, group.index, x.shape[0], gathered=False)
        if _protocol("reduce_scatter_v", algorithm) is CHUNKED:
            return self._pipelined_rows("reduce_scatter_v", x, sizes, group, out_rows, x.shape[0])
        if _is_lamport("reduce_scatter_v", algorithm):
            return kernels.call("lamport_reduce_scatter_v", x, sizes.device, list(sizes.host or ()),
                                                                 self.handles[group.name], out_rows, self.pdl)
        return kernels.call("reduce_scatter_v", x, sizes.device, list(sizes.host or ()),
                                                     self.handles[group.name], out_rows, self.pdl)

    def gather_tokens(self, x, dp_sizes: Sizes, partial: bool, fusion, algorithm, quant=None):
        dp = self.groups["attn_dp"]
        out_rows = result_rows(dp_sizes, dp.index, x.shape[0], gathered=True)
        handle, tp = self.handles["world"], self.layout.attn_tp
        if quant is not None:
            return self._quant_gather(x, dp_sizes, self.groups["world"], tp, partial, fusion, quant,
                                      OpCode.GATHER_TOKENS, out_rows, "gather_tokens_quant", algorithm)
        if fusion is not None:
            return kernels.call(self._fused_gather(algorithm, x), x, *_gather_sizes(dp_sizes),
                                fusion.residual, fusion.weight, fusion.eps, handle, tp, partial, out_rows, self.pdl)
        if _is_composed("gather_tokens", algorithm):
            return self.two_step.gather_tokens(x, dp_sizes, partial)
        if tp == 1:
            # One rank per DP group: the transition is all_gather_v over the world (same rows,
            # same order), and that kernel is the leaner one (measured: results/4xH200).
            return self._reduced("gather_tokens", x, dp_sizes, algorithm)
        if not partial:
            algorithm = "one_shot"  # replicated rows: one-shot already sends each row once; nothing to reduce
        if _is_lamport("gather_tokens", algorithm):
            return kernels.call("lamport_gather_tokens", x, *_gather_sizes(dp_sizes), handle, tp, out_rows, self.pdl)
        return kernels.call("gather_tokens", x, *_gather_sizes(dp_sizes), handle, tp, partial,
                            _code("gather_tokens", algorithm), out_rows, self.pdl)

    @staticmethod
    def _fused_gather(algorithm: str, x) -> str:
        """The kernel of a fused gather: fused_lamport's where the row fits its staging
        (ops.FUSED_LAMPORT), else the LL kernel's (`fused`), within the LL bound
        _bounding_protocol gave."""
        if algorithm == FUSED_LAMPORT.name and math.prod(x.shape[1:]) <= MAX_QUANT_HIDDEN:
            return "lamport_gather_tokens_norm"
        return "gather_tokens_norm"

    def scatter_tokens(self, y, dp_sizes: Sizes, algorithm):
        if _is_composed("scatter_tokens", algorithm):
            return self.two_step.scatter_tokens(y, dp_sizes)
        if self.layout.attn_tp == 1:
            # One rank per DP group: exactly reduce_scatter_v over the world, the leaner kernel.
            return self._reduced("scatter_tokens", y, dp_sizes, algorithm)
        dp = self.groups["attn_dp"]
        out_rows = result_rows(dp_sizes, dp.index, y.shape[0], gathered=False)
        if _is_lamport("scatter_tokens", algorithm):
            return kernels.call("lamport_scatter_tokens", y, dp_sizes.device, list(dp_sizes.host or ()),
                                                               self.handles["world"], self.layout.attn_tp, out_rows,
                                                               self.pdl)
        return kernels.call("scatter_tokens", y, dp_sizes.device, list(dp_sizes.host or ()), self.handles["world"],
                                                   self.layout.attn_tp, _code("scatter_tokens", algorithm), out_rows,
                                                   self.pdl)

    def _reduced(self, op: str, x, dp_sizes: Sizes, algorithm: str):
        """A transition run as the op it is when its attention-TP axis has size 1."""
        other, algorithm = reduced(op, algorithm)
        return getattr(self, other)(x, dp_sizes, self.groups["world"], algorithm)

    def close(self) -> None:
        """Release the workspace now; the caller has synchronised the device."""
        for handle in self.handles.values():
            kernels.release_group(handle)
        self.handles = {}
        self.workspace.close()

    def _quant_gather(self, x, sizes: Sizes, group: Group, tp: int, partial: bool, fusion, quant, op: int,
                      out_rows: int, spec: str, algorithm: str):
        """One kernel: reduce over tp (when partial), add + norm (fusion), quantize, gather (on
        the Lamport protocol or LL; `spec`: the quantized op whose `algorithm` runs)."""
        residual, weight, eps = (None, None, 0.0) if fusion is None else (fusion.residual, fusion.weight, fusion.eps)
        if algorithm == QUANT_LOCAL.name and (tp == 1 or not partial or (fusion is not None and tp < group.size)):
            # Its kernel sums partial rows, fused ones with one DP group only (ops.QUANT_LOCAL): the LL
            # kernel's one-hop path runs the others (the owner path where tp = 1), within the LL bound
            # _bounding_protocol gave.
            algorithm = "quant" if tp == 1 else "quant_one_hop"
        data, scales, residual_out = kernels.call(
            "quant_gather", x, *_gather_sizes(sizes), residual, weight, eps, quant.global_scale,
            self.handles[group.name], tp, partial, op, quant.format.code, out_rows, _code(spec, algorithm),
            _is_lamport(spec, algorithm), self.pdl)
        rows = QuantizedRows(data, scales, quant.format.name, quant.global_scale)
        return rows if fusion is None else (rows, residual_out)

    # -- errors ------------------------------------------------------------------------------
    def raise_recorded_error(self) -> None:
        if not self.workspace.args:
            return
        error = self.workspace.recorded_error()
        if error is None:
            return
        op, group = op_name(error.op), GROUP_NAMES[error.group]
        if error.code == ErrorCode.CAPACITY:
            # Kernels stayed in step (every rank skipped or clamped the same way): clear and go on.
            self.workspace.clear_error()
            raise CapacityExceeded(f"{op} on group {group!r}: device-side sizes asked for more rows "
                                   f"than the buffers or the workspace hold (seen by rank {error.peer}); "
                                   f"that call's output is incomplete")
        if error.code == ErrorCode.ARGUMENT_MISMATCH:
            # Every rank finished that call (nobody waits on a peer that disagrees), so the
            # group is in step. Clear once no queued kernel can still record it (outside capture).
            if not torch.cuda.is_current_stream_capturing():
                torch.cuda.synchronize(self.workspace.error_word.device)
                self.workspace.clear_error()
            raise ArgumentMismatch.on_device(op, group, error.peer, MISMATCH_WORDS.get(error.detail, f"field {error.detail}"))
        raise PeerTimeout(op, group, error.peer, self.timeout_s)


# What the kernels found different between two ranks' calls (the detail of ARGUMENT_MISMATCH).
MISMATCH_WORDS = {
    CallField.OP: "op (a skipped or reordered call?)",
    CallField.DTYPE: "dtype",
    CallField.ALGORITHM: "algorithm (other sizes or another selection table? or Lamport slots out of step "
                         "since an earlier mismatch: docs/lamport.md)",
    CallField.VARIANT: "attn_tp / partial (all_reduce: the pipelined two-shot's chunk size)",
    CallField.COUNTS: "row counts (sizes)",
    CallField.WIDTH: "row width in bytes (all_reduce: message bytes)",
}


def _gather_sizes(sizes: Sizes) -> tuple:
    """A gather kernel's count arguments (sizes, host_sizes, own, learned): in own-count mode
    (counts.py) this rank's count alone and the tensor the kernel fills with every member's."""
    if sizes.own is not None:
        return None, [], sizes.own, sizes.device
    return sizes.device, list(sizes.host or ()), None, None


# Facts of the op table looked up on every call: cached (OPS is fixed at import).
@functools.cache
def _protocol(op: str, algorithm: str):
    return OPS[op].algorithm(algorithm).protocol


@functools.cache
def _is_lamport(op: str, algorithm: str) -> bool:
    return _protocol(op, algorithm) is LAMPORT


@functools.cache
def _is_composed(op: str, algorithm: str) -> bool:
    return OPS[op].algorithm(algorithm).composed


@functools.cache
def _code(op: str, algorithm: str) -> int:
    return int(OPS[op].algorithm(algorithm).code)
