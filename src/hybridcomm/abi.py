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
ARRIVAL_BYTES = 256
FLAG_BYTES = ARRIVAL_BYTES + 2 * MAX_RANKS * MAX_BLOCKS * 4
STATE_WORDS = 4
ROW_ALIGN_BYTES = 16  # rows (and all_reduce messages) are a multiple of this

# -- protocols: payload bytes per unit, and area bytes per payload byte -----------------------
LL_UNIT_BYTES, LL_WIRE_FACTOR = 8, 2
BULK_UNIT_BYTES, BULK_WIRE_FACTOR = 16, 1


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


class GatherTokensAlgorithm(IntEnum):
    ONE_SHOT = 0
    TWO_SHOT = 1
    FUSED = 2


class ScatterTokensAlgorithm(IntEnum):
    ONE_SHOT = 0
    TWO_SHOT = 1


class ErrorCode(IntEnum):
    OK = 0
    TIMEOUT = 1
    CAPACITY = 2


# -- the error word: code | op << 8 | group << 16 | global rank of the peer << 24 -------------
ERROR_OP_SHIFT, ERROR_GROUP_SHIFT, ERROR_PEER_SHIFT = 8, 16, 24
ERROR_FIELD_MASK, ERROR_PEER_MASK = 0xFF, 0xFFFF


@dataclass(frozen=True)
class RecordedError:
    code: int  # an ErrorCode (an int if the kernel library is newer than this mirror)
    op: int  # an OpCode
    group: int  # index into layout.GROUP_NAMES
    peer: int  # global rank the error is about


def decode_error(word: int) -> RecordedError:
    code = word & ERROR_FIELD_MASK
    return RecordedError(ErrorCode(code) if code in ErrorCode._value2member_map_ else code,
                         (word >> ERROR_OP_SHIFT) & ERROR_FIELD_MASK,
                         (word >> ERROR_GROUP_SHIFT) & ERROR_FIELD_MASK,
                         (word >> ERROR_PEER_SHIFT) & ERROR_PEER_MASK)


def _c_enum(prefix: str, enum: type[IntEnum]) -> dict[str, int]:
    """C names of an enum's members: AllReduceAlgorithm.TWO_SHOT_BULK -> kAllReduceTwoShotBulk."""
    return {"k" + prefix + "".join(w.capitalize() for w in m.name.split("_")): int(m) for m in enum}


# Every constant and enum value of abi.h, by its C name (the build test probes each).
C_NAMES: dict[str, int] = {
    "kMaxRanks": MAX_RANKS, "kThreads": THREADS, "kMaxBlocks": MAX_BLOCKS, "kArrivalBytes": ARRIVAL_BYTES,
    "kFlagBytes": FLAG_BYTES, "kStateWords": STATE_WORDS, "kRowAlignBytes": ROW_ALIGN_BYTES,
    "kLLUnitBytes": LL_UNIT_BYTES, "kLLWireFactor": LL_WIRE_FACTOR,
    "kBulkUnitBytes": BULK_UNIT_BYTES, "kBulkWireFactor": BULK_WIRE_FACTOR,
    **_c_enum("", OpCode), "kFloat32": DType.FLOAT32, "kFloat16": DType.FLOAT16, "kBFloat16": DType.BFLOAT16,
    **_c_enum("AllReduce", AllReduceAlgorithm), **_c_enum("GatherTokens", GatherTokensAlgorithm),
    **_c_enum("ScatterTokens", ScatterTokensAlgorithm), **_c_enum("", ErrorCode),
    "kErrorOpShift": ERROR_OP_SHIFT, "kErrorGroupShift": ERROR_GROUP_SHIFT, "kErrorPeerShift": ERROR_PEER_SHIFT,
    "kErrorFieldMask": ERROR_FIELD_MASK, "kErrorPeerMask": ERROR_PEER_MASK,
    "kCalls": 0, "kBlocksDone": 1, "kAborted": 2,  # GroupState words (device-only; listed for the probe)
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


_P, _I, _I64, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
_G = ctypes.POINTER(GroupArgs)
# extern "C" launchers: argument types (each returns int, a cudaError_t value).
SIGNATURES = {
    "hc_all_reduce": [_G, _I, _I, _P, _P, _I64, _P],
    "hc_all_gather_v": [_G, _P, _P, _P, _P, _I64, _I64, _I64, _P],
    "hc_reduce_scatter_v": [_G, _I, _P, _P, _P, _P, _I64, _I64, _I64, _P],
    "hc_gather_tokens": [_G, _I, _I, _I, _I, _P, _P, _P, _P, _P, _F, _P, _P, _I64, _I64, _I64, _P],
    "hc_scatter_tokens": [_G, _I, _I, _I, _P, _P, _P, _P, _I64, _I64, _I64, _P],
}
