// The C ABI of the kernel library: every constant, code and struct the host must agree on.
//
// src/hybridcomm/abi.py mirrors each name here (C_NAMES there); tests/test_build.py compiles a
// probe that prints every constant and enum value of this file and the struct offsets, and
// compares them with abi.py. Add a name here -> add it there (the test says which is missing).
// See docs/architecture.md ("The ABI").
#pragma once

#include <stdint.h>

#if defined(__CUDACC__)
#define HC_HOST_DEVICE __host__ __device__
#else
#define HC_HOST_DEVICE
#endif

namespace hc {

// -- limits ----------------------------------------------------------------------------------
constexpr int kMaxRanks = 8;      // members of one group
constexpr int kThreads = 512;     // threads per block of every kernel
constexpr int kMaxBlocks = 256;   // blocks per kernel (bulk-protocol flags per (phase, source))
// Arrival packets at the start of a group's region, two LL packets per (slot, source): the
// arrival, which says "source started call `flag`" and carries the call's fingerprint
// (call.cuh), then the count, which carries the source's own row count in calls given only
// that (own_count.cuh).
constexpr int kArrivalBytes = 2 * 2 * kMaxRanks * 16;
// Flags at the start of a group's region: arrival flags, then one flag per (phase, source,
// block) for the bulk protocol.
constexpr int kFlagBytes = kArrivalBytes + 2 * kMaxRanks * kMaxBlocks * 4;
constexpr int kStateWords = 4;    // uint32 words of a group's local GroupState
constexpr int kRowAlignBytes = 16;  // rows (and all_reduce messages) are a multiple of this

// -- protocols: payload bytes per unit, and bytes a unit occupies in a receive area ---------
// LL: 16-byte packets carrying 8 bytes of payload and the call's flag twice.
constexpr int kLLUnitBytes = 8;
constexpr int kLLWireFactor = 2;
// Bulk: plain 16-byte stores, one release flag per block.
constexpr int kBulkUnitBytes = 16;
constexpr int kBulkWireFactor = 1;
// Lamport: plain 16-byte stores of data into areas pre-filled with a sentinel (lamport.cuh);
// its own areas, 3 rotating slots x members per group region, after the LL/bulk slots.
constexpr int kLamportUnitBytes = 16;
constexpr int kLamportWireFactor = 1;
constexpr int kLamportSlots = 3;
constexpr int kLamportStateWords = 3;  // uint32 words of a group's local LamportState
// The fingerprint's algorithm field of a Lamport one-shot is kLamportOneShot + its slot (0..2):
// it differs from every LL/bulk code, so ranks that chose different protocols for one call
// raise ArgumentMismatch; and ranks whose Lamport slots went out of step (after such a call)
// keep raising it rather than reading a stale slot (docs/lamport.md).
constexpr int kLamportOneShot = 8;
// Chunked (the pipelined two-shot, chunked.cuh): plain 16-byte stores into areas of their own
// (2 slots x 2 phases x members per group region, after the Lamport slots), one release flag
// per (phase, source, chunk) ahead of them; chunk sizes are powers of two in
// [kMinChunkBytes, kMaxChunkBytes], raised where a source's part would need more than
// kMaxChunks chunks.
constexpr int kChunkedUnitBytes = 16;
constexpr int kChunkedWireFactor = 1;
constexpr int kMaxChunks = 4096;
constexpr int kChunkFlagBytes = 2 * kMaxRanks * kMaxChunks * 4;
constexpr int kMinChunkBytes = 1024;
constexpr int kMaxChunkBytes = 512 * 1024;
// The fingerprint's algorithm field of the pipelined one-shots on the chunked protocol (row
// ops): differs from the LL one-shot's 0 and the Lamport one-shot's kLamportOneShot + slot.
constexpr int kChunkedOneShot = 4;

// The capacity rule (ops.py `Protocol.fits` is its host mirror): what one source sends one
// peer in one phase must fit one receive area.
HC_HOST_DEVICE inline bool fits_area(int64_t payload_bytes, int wire_factor, uint64_t area_bytes) {
  return payload_bytes * wire_factor <= (int64_t)area_bytes;
}

// -- codes -----------------------------------------------------------------------------------
enum Op : int { kAllReduce = 1, kAllGatherV = 2, kReduceScatterV = 3, kGatherTokens = 4, kScatterTokens = 5 };
enum DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };
// kAllReduceTwoShotPipelined has its own launcher (hc_all_reduce_pipelined); its code is the
// fingerprint's algorithm field there.
enum AllReduceAlgorithm : int { kAllReduceOneShot = 0, kAllReduceTwoShot = 1, kAllReduceTwoShotBulk = 2,
                                kAllReduceTwoShotPipelined = 3 };
enum GatherTokensAlgorithm : int { kGatherTokensOneShot = 0, kGatherTokensTwoShot = 1, kGatherTokensFused = 2 };
enum ScatterTokensAlgorithm : int { kScatterTokensOneShot = 0, kScatterTokensTwoShot = 1 };
// Quantized gathers (hybridcomm.quant.formats): the format, and the largest hidden size (a row
// is staged as fp32 in shared memory, with its scale bytes, within 48 KiB).
enum QuantFormat : int { kQuantFp8 = 0, kQuantFp8Block128 = 1, kQuantNvfp4 = 2 };
// Who sums a DP group's partial rows before they are quantized (quant_rows.cuh): the row's owner,
// or every tp rank of the group (one hop inside it); or (local, Lamport only) every rank sums
// every row and quantizes it where it lands (lamport_quant_local.cu).
enum QuantGatherAlgorithm : int { kQuantGatherOwner = 0, kQuantGatherOneHop = 1, kQuantGatherLocal = 2 };
constexpr int kMaxQuantHidden = 11264;

// -- the error word: code | op << 8 | group << 16 | peer's global rank << 24 | detail << 40 --
enum ErrorCode : uint32_t { kOk = 0, kTimeout = 1, kCapacity = 2, kArgumentMismatch = 3 };
constexpr int kErrorOpShift = 8;
constexpr int kErrorGroupShift = 16;
constexpr int kErrorPeerShift = 24;
constexpr int kErrorDetailShift = 40;  // kArgumentMismatch: the CallField that differs
constexpr int kErrorFieldMask = 0xff;  // code, op, group and detail
constexpr int kErrorPeerMask = 0xffff;

HC_HOST_DEVICE inline unsigned long long pack_error(uint32_t code, int op, int group, int peer, int detail = 0) {
  return (unsigned long long)(code & kErrorFieldMask) | ((unsigned long long)(op & kErrorFieldMask) << kErrorOpShift) |
         ((unsigned long long)(group & kErrorFieldMask) << kErrorGroupShift) |
         ((unsigned long long)(peer & kErrorPeerMask) << kErrorPeerShift) |
         ((unsigned long long)(detail & kErrorFieldMask) << kErrorDetailShift);
}

// -- the call fingerprint: what every rank of a group must agree on for one call -------------
// 64 bits, sent to every peer in the first packet of a call (call.cuh). Fields from the top:
// op | dtype | algorithm | variant (transitions: attn_tp - 1 | partial << 3; pipelined all_reduce:
// log2(chunk bytes / kMinChunkBytes)) | counts hash | width
// (row bytes; all_reduce: message bytes), so the first field that differs is the most telling.
enum CallField : int { kFieldOp = 1, kFieldDType = 2, kFieldAlgorithm = 3, kFieldVariant = 4, kFieldCounts = 5,
                       kFieldWidth = 6 };
constexpr int kFingerprintOpShift = 60;
constexpr int kFingerprintDTypeShift = 56;
constexpr int kFingerprintAlgorithmShift = 52;
constexpr int kFingerprintVariantShift = 48;
constexpr int kFingerprintCountsShift = 32;
constexpr int kOtherDType = 15;  // a dtype the kernels do not reduce (all_gather_v moves any)

HC_HOST_DEVICE inline uint64_t make_fingerprint(int op, int dtype, int algorithm, int variant, uint32_t counts_hash,
                                                uint64_t width) {
  return ((uint64_t)(op & 0xf) << kFingerprintOpShift) | ((uint64_t)(dtype & 0xf) << kFingerprintDTypeShift) |
         ((uint64_t)(algorithm & 0xf) << kFingerprintAlgorithmShift) |
         ((uint64_t)(variant & 0xf) << kFingerprintVariantShift) |
         ((uint64_t)(counts_hash & 0xffff) << kFingerprintCountsShift) | (width & 0xffffffffull);
}

// The first field in which two fingerprints differ (0: none).
HC_HOST_DEVICE inline int first_difference(uint64_t a, uint64_t b) {
  const uint64_t d = a ^ b;
  if (!d) return 0;
  if (d >> kFingerprintOpShift) return kFieldOp;
  if ((d >> kFingerprintDTypeShift) & 0xf) return kFieldDType;
  if ((d >> kFingerprintAlgorithmShift) & 0xf) return kFieldAlgorithm;
  if ((d >> kFingerprintVariantShift) & 0xf) return kFieldVariant;
  if ((d >> kFingerprintCountsShift) & 0xffff) return kFieldCounts;
  return kFieldWidth;
}

// -- what the host passes --------------------------------------------------------------------

// One group's view of the workspace, fixed for the communicator's lifetime.
struct GroupArgs {
  int nranks;                      // members of the group
  int me;                          // my index in the group
  int world_ranks[kMaxRanks];      // global rank of each member (for error reports)
  char* regions[kMaxRanks];        // each member's region of the symmetric buffer (peer pointers)
  uint32_t* state;                 // local GroupState (kStateWords words)
  unsigned long long* error_word;    // device memory, shared by all groups of the communicator
  unsigned long long* error_mirror;  // pinned host memory the host polls without a sync
  uint64_t area_bytes;             // bytes of one receive area (one source, one slot, A or B)
  uint64_t timeout_ns;
  int group_id;                    // index of the group's name, for error reports
  int max_blocks;                  // grid limit (host side): one block per SM keeps all co-resident
};

// Row counts per member: read from device memory (graph replays with new counts) or given inline;
// or, in own-count mode, this rank's count alone, exchanged by the kernel (own_count.cuh).
struct SizesArg {
  const int32_t* device;  // null: use host[]
  int32_t host[kMaxRanks];
  const int32_t* own;     // own-count mode: this rank's (DP group's) count in device memory; null: off
  int32_t* learned;       // own-count mode: where the kernel writes every member's count
};

// GroupState words (local device memory, zero at start).
enum GroupStateWord : int { kCalls = 0, kBlocksDone = 1, kAborted = 2 };

// One group's Lamport view of the workspace, fixed for the communicator's lifetime.
struct LamportArgs {
  char* bases[kMaxRanks];  // each member's Lamport part of the group's region (peer pointers)
  uint32_t* state;         // local LamportState (kLamportStateWords words)
  uint64_t area_bytes;     // bytes of one Lamport area (one source, one slot)
};

// LamportState words (local device memory, zero at start; the areas start as the sentinel):
// the slot the next Lamport call uses (0..2), the units per source area the last one used, and
// whether an error was recorded by then, e.g. a peer whose call differed (then the next Lamport
// call re-fills that call's whole slot).
enum LamportStateWord : int { kLamportSlot = 0, kLamportUsedUnits = 1, kLamportMismatched = 2 };

}  // namespace hc
