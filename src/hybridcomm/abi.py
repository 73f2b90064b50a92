"""Python's mirror of the kernel library's C ABI, csrc/abi.h: limits, codes, the error word,
the GroupArgs struct and the launchers' signatures. Nothing else in Python spells these.

tests/test_build.py compiles a probe that prints every constant and enum value of abi.h and
compares each with C_NAMES below (and the struct offsets with GroupArgs), so a change on
one side that is not made on the other fails CI. See docs/architecture.md ("The ABI").
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from enum import IntEnum

import torch

# -- limits -----------------------------------------------------------------------------------
MAX_RANKS = 8
THREADS = 512
MAX_BLOCKS = 256
ARRIVAL_BYTES = 2 * 2 * MAX_RANKS * 16  # two LL packets per (slot, source): arrival and own count
FLAG_BYTES = ARRIVAL_BYTES + 2 * MAX_RANKS * MAX_BLOCKS * 4
STATE_WORDS = 4
ROW_ALIGN_BYTES = 16  # rows (and all_reduce messages) are a multiple of this

# -- protocols: payload bytes per unit, and area bytes per payload byte -----------------------
LL_UNIT_BYTES, LL_WIRE_FACTOR = 8, 2
BULK_UNIT_BYTES, BULK_WIRE_FACTOR = 16, 1
LAMPORT_UNIT_BYTES, LAMPORT_WIRE_FACTOR = 16, 1
LAMPORT_SLOTS = 3
LAMPORT_STATE_WORDS = 3
LAMPORT_ONE_SHOT = 8  # the fingerprint's algorithm field of a Lamport one-shot: this + its slot
# Chunked (the pipelined two-shot, csrc/chunked.cuh): its own areas after the Lamport slots
CHUNKED_UNIT_BYTES, CHUNKED_WIRE_FACTOR = 16, 1
MAX_CHUNKS = 4096  # release flags per (phase, source)
CHUNK_FLAG_BYTES = 2 * MAX_RANKS * MAX_CHUNKS * 4
MIN_CHUNK_BYTES, MAX_CHUNK_BYTES = 1024, 512 * 1024  # chunk sizes: powers of two between
CHUNKED_ONE_SHOT = 4  # the fingerprint's algorithm field of the row ops' pipelined one-shots


# -- codes --------------------------------------------------------------------------------------
class OpCode(IntEnum):
    ALL_REDUCE = 1
    ALL_GATHER_V = 2
    REDUCE_SCATTER_V = 3
    GATHER_TOKENS = 4
    SCATTER_TOKENS = 5


class DType(IntEnum):
    FLOAT32 = 0
    FLOAT16 = 1
    BFLOAT16 = 2


DTYPE_CODE = {torch.float32: DType.FLOAT32, torch.float16: DType.FLOAT16, torch.bfloat16: DType.BFLOAT16}


class AllReduceAlgorithm(IntEnum):
    ONE_SHOT = 0
    TWO_SHOT = 1
    TWO_SHOT_BULK = 2
    TWO_SHOT_PIPELINED = 3


class GatherTokensAlgorithm(IntEnum):
    ONE_SHOT = 0
    TWO_SHOT = 1
    FUSED = 2


class ScatterTokensAlgorithm(IntEnum):
    ONE_SHOT = 0
    TWO_SHOT = 1


class QuantFormat(IntEnum):
    FP8 = 0
    FP8_BLOCK128 = 1
    NVFP4 = 2


class QuantGatherAlgorithm(IntEnum):  # who sums a DP group's partial rows (csrc/quant_rows.cuh)
    OWNER = 0
    ONE_HOP = 1
    LOCAL = 2  # every rank sums every row and quantizes it where it lands (csrc/lamport_quant_local.cu)


MAX_QUANT_HIDDEN = 11264  # quantized gathers stage a row in 48 KiB of shared memory


class ErrorCode(IntEnum):
    OK = 0
    TIMEOUT = 1
    CAPACITY = 2
    ARGUMENT_MISMATCH = 3


# -- the error word: code | op << 8 | group << 16 | peer's global rank << 24 | detail << 40 ----
ERROR_OP_SHIFT, ERROR_GROUP_SHIFT, ERROR_PEER_SHIFT, ERROR_DETAIL_SHIFT = 8, 16, 24, 40
ERROR_FIELD_MASK, ERROR_PEER_MASK = 0xFF, 0xFFFF


class CallField(IntEnum):
    """The part of a call's fingerprint that differs (the detail of ARGUMENT_MISMATCH)."""

    OP = 1
    DTYPE = 2
    ALGORITHM = 3
    VARIANT = 4  # attn_tp / partial of a token transition; the pipelined all_reduce's chunk size
    COUNTS = 5
    WIDTH = 6  # row bytes (all_reduce: message bytes)


# The fingerprint's layout (csrc/abi.h make_fingerprint; only the device builds fingerprints).
FINGERPRINT_OP_SHIFT, FINGERPRINT_DTYPE_SHIFT, FINGERPRINT_ALGORITHM_SHIFT = 60, 56, 52
FINGERPRINT_VARIANT_SHIFT, FINGERPRINT_COUNTS_SHIFT = 48, 32
OTHER_DTYPE = 15  # a dtype the kernels do not reduce (all_gather_v moves any)


@dataclass(frozen=True)
class RecordedError:
    code: int  # an ErrorCode (an int if the kernel library is newer than this mirror)
    op: int  # an OpCode
    group: int  # index into layout.GROUP_NAMES
    peer: int  # global rank the error is about
    detail: int = 0  # ARGUMENT_MISMATCH: the CallField that differs


def decode_error(word: int) -> RecordedError:
    code = word & ERROR_FIELD_MASK
    return RecordedError(ErrorCode(code) if code in ErrorCode._value2member_map_ else code,
                         (word >> ERROR_OP_SHIFT) & ERROR_FIELD_MASK,
                         (word >> ERROR_GROUP_SHIFT) & ERROR_FIELD_MASK,
                         (word >> ERROR_PEER_SHIFT) & ERROR_PEER_MASK,
                         (word >> ERROR_DETAIL_SHIFT) & ERROR_FIELD_MASK)


def _c_enum(prefix: str, enum: type[IntEnum], spelled: dict[str, str] | None = None) -> dict[str, int]:
    """C names of an enum's members: AllReduceAlgorithm.TWO_SHOT_BULK -> kAllReduceTwoShotBulk
    (`spelled`: member name -> its C spelling where capitalising words is not it)."""
    spelled = spelled or {}
    return {"k" + prefix + spelled.get(m.name, "".join(w.capitalize() for w in m.name.split("_"))): int(m)
            for m in enum}


# Every constant and enum value of abi.h, by its C name (the build test probes each).
C_NAMES: dict[str, int] = {
    "kMaxRanks": MAX_RANKS, "kThreads": THREADS, "kMaxBlocks": MAX_BLOCKS, "kArrivalBytes": ARRIVAL_BYTES,
    "kFlagBytes": FLAG_BYTES, "kStateWords": STATE_WORDS, "kRowAlignBytes": ROW_ALIGN_BYTES,
    "kLLUnitBytes": LL_UNIT_BYTES, "kLLWireFactor": LL_WIRE_FACTOR,
    "kBulkUnitBytes": BULK_UNIT_BYTES, "kBulkWireFactor": BULK_WIRE_FACTOR,
    "kLamportUnitBytes": LAMPORT_UNIT_BYTES, "kLamportWireFactor": LAMPORT_WIRE_FACTOR,
    "kLamportSlots": LAMPORT_SLOTS, "kLamportStateWords": LAMPORT_STATE_WORDS, "kLamportOneShot": LAMPORT_ONE_SHOT,
    "kChunkedUnitBytes": CHUNKED_UNIT_BYTES, "kChunkedWireFactor": CHUNKED_WIRE_FACTOR, "kMaxChunks": MAX_CHUNKS,
    "kChunkFlagBytes": CHUNK_FLAG_BYTES, "kMinChunkBytes": MIN_CHUNK_BYTES, "kMaxChunkBytes": MAX_CHUNK_BYTES,
    "kChunkedOneShot": CHUNKED_ONE_SHOT,
    **_c_enum("", OpCode), **_c_enum("", DType, {"BFLOAT16": "BFloat16"}),
    **_c_enum("AllReduce", AllReduceAlgorithm), **_c_enum("GatherTokens", GatherTokensAlgorithm),
    **_c_enum("ScatterTokens", ScatterTokensAlgorithm), **_c_enum("", ErrorCode),
    **_c_enum("Quant", QuantFormat), **_c_enum("QuantGather", QuantGatherAlgorithm),
    "kMaxQuantHidden": MAX_QUANT_HIDDEN,
    "kErrorOpShift": ERROR_OP_SHIFT, "kErrorGroupShift": ERROR_GROUP_SHIFT, "kErrorPeerShift": ERROR_PEER_SHIFT,
    "kErrorDetailShift": ERROR_DETAIL_SHIFT, "kErrorFieldMask": ERROR_FIELD_MASK, "kErrorPeerMask": ERROR_PEER_MASK,
    **_c_enum("Field", CallField, {"DTYPE": "DType"}),
    "kFingerprintOpShift": FINGERPRINT_OP_SHIFT, "kFingerprintDTypeShift": FINGERPRINT_DTYPE_SHIFT,
    "kFingerprintAlgorithmShift": FINGERPRINT_ALGORITHM_SHIFT, "kFingerprintVariantShift": FINGERPRINT_VARIANT_SHIFT,
    "kFingerprintCountsShift": FINGERPRINT_COUNTS_SHIFT, "kOtherDType": OTHER_DTYPE,
    "kCalls": 0, "kBlocksDone": 1, "kAborted": 2,  # GroupState words (device-only; listed for the probe)
    "kLamportSlot": 0, "kLamportUsedUnits": 1, "kLamportMismatched": 2,  # LamportState words (device-only)
}


# -- structs and launchers -------------------------------------------------------------------------
class GroupArgs(ctypes.Structure):
    """hc::GroupArgs."""

    _fields_ = [
        ("nranks", ctypes.c_int),
        ("me", ctypes.c_int),
        ("world_ranks", ctypes.c_int * MAX_RANKS),
        ("regions", ctypes.c_void_p * MAX_RANKS),
        ("state", ctypes.c_void_p),
        ("error_word", ctypes.c_void_p),
        ("error_mirror", ctypes.c_void_p),
        ("area_bytes", ctypes.c_uint64),
        ("timeout_ns", ctypes.c_uint64),
        ("group_id", ctypes.c_int),
        ("max_blocks", ctypes.c_int),
    ]


class LamportArgs(ctypes.Structure):
    """hc::LamportArgs."""

    _fields_ = [
        ("bases", ctypes.c_void_p * MAX_RANKS),
        ("state", ctypes.c_void_p),
        ("area_bytes", ctypes.c_uint64),
    ]


_P, _I, _I64, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
_G, _L = ctypes.POINTER(GroupArgs), ctypes.POINTER(LamportArgs)
# extern "C" launchers: argument types (each returns int, a cudaError_t value).
# Every launcher's last two: pdl (launch overlapping the previous kernel, csrc/pdl.cuh), stream.
# The gathers' own_count (after sizes_host): this rank's count alone in device memory, exchanged
# inside the kernel, which then writes every member's count to sizes_device (csrc/own_count.cuh).
SIGNATURES = {
    "hc_all_reduce": [_G, _I, _I, _P, _P, _I64, _I, _P],
    "hc_all_gather_v": [_G, _I, _P, _P, _P, _P, _P, _I64, _I64, _I64, _I, _P],
    "hc_reduce_scatter_v": [_G, _I, _P, _P, _P, _P, _I64, _I64, _I64, _I, _P],
    "hc_gather_tokens": [_G, _I, _I, _I, _I, _P, _P, _P, _P, _P, _F, _P, _P, _P, _I64, _I64, _I64, _I, _P],
    "hc_scatter_tokens": [_G, _I, _I, _I, _P, _P, _P, _P, _I64, _I64, _I64, _I, _P],
    # quantized gather (quant_gather.cu)
    "hc_quant_gather": [_G, _I, _I, _I, _I, _I, _I, _P, _P, _P, _P, _F, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64,
                        _I, _P],
    "hc_lamport_quant_gather": [_G, _L, _I, _I, _I, _I, _I, _I, _P, _P, _P, _P, _F, _P, _P, _P, _P, _P, _P, _I64,
                                _I64, _I64, _I, _P],
    # the quantizers' element conversions (element_codes.cu, for tests)
    "hc_element_codes": [_I, _P, _P, _I64, _P],
    # residual add + RMSNorm (add_rms_norm.cu, the NCCL baseline's fused norm): dtype, reduced, residual, weight,
    # eps, normed, residual_out, rows, row_bytes, stream
    "hc_add_rms_norm": [_I, _P, _P, _P, _F, _P, _P, _I64, _I64, _P],
    # Lamport one-shots (lamport_*.cu)
    "hc_lamport_all_reduce": [_G, _L, _I, _P, _P, _I64, _I, _P],
    "hc_lamport_all_gather_v": [_G, _L, _I, _P, _P, _P, _P, _P, _I64, _I64, _I64, _I, _P],
    "hc_lamport_reduce_scatter_v": [_G, _L, _I, _P, _P, _P, _P, _I64, _I64, _I64, _I, _P],
    "hc_lamport_gather_tokens": [_G, _L, _I, _I, _P, _P, _P, _P, _P, _I64, _I64, _I64, _I, _P],
    "hc_lamport_scatter_tokens": [_G, _L, _I, _I, _P, _P, _P, _P, _I64, _I64, _I64, _I, _P],
    # gather_tokens fused with residual add + RMSNorm on the Lamport protocol (lamport_fused_tokens.cu): dtype, tp,
    # partial, in, out, residual, weight, residual_out, eps, sizes, host sizes, own count, row_bytes, in_rows, out_rows
    "hc_lamport_gather_tokens_norm": [_G, _L, _I, _I, _I, _P, _P, _P, _P, _P, _F, _P, _P, _P, _I64, _I64, _I64, _I,
                                      _P],
    # pipelined two-shot all_reduce (pipelined_all_reduce.cu): dtype, in, out, nbytes, chunk_bytes, blocks
    "hc_all_reduce_pipelined": [_G, _I, _P, _P, _I64, _I64, _I, _I, _P],
    # pipelined one-shots (pipelined_<op>.cu): hc_<op>'s arguments, then chunk_bytes, blocks, then pdl, stream
    "hc_all_gather_v_pipelined": [_G, _I, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I, _I, _P],
    "hc_reduce_scatter_v_pipelined": [_G, _I, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I, _I, _P],
    # the trace build's rings (trace.cu, read by hybridcomm/trace.py; the normal build has none)
    "hc_trace_rings": [],
    "hc_trace_ring_bytes": [],
    "hc_trace_copy": [_I, _P, _P],
    "hc_trace_clear": [_P],
}
