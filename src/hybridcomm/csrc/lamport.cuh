// The Lamport protocol: the payload is the flag.
//
// Every 16-byte store carries 16 bytes of data (LL packets carry 8). A receive area is filled
// with a sentinel bit pattern before anyone writes to it; the receiver polls a 16-byte unit
// until none of its four 32-bit words equals the sentinel word. So data and "ready" arrive
// together without a flag: a store torn into pieces (NVLink keeps aligned 4-byte words whole)
// shows a sentinel word in the part not yet landed and is simply polled again.
//
// Reserved pattern. No word of real data may equal the sentinel word 0xFFFFFFFF, so inputs go
// through fix_reserved() (reserved.cuh) before they are sent and before they are used locally.
// The reference backend and the oracle apply the same transform (hybridcomm/reserved.py), so
// every backend returns the same bits.
//
// Slots. A group's Lamport part of the workspace holds 3 slots x members areas per rank; area
// (slot, src) on rank r receives what member src sends r in a call that uses `slot`. The slot
// is a per-group counter in device memory (LamportState, 0..2), advanced by every Lamport call
// of the group, on every rank in the same order, so graphs replay without host fix-ups. Call L
// uses slot L % 3 and re-fills (with the sentinel) this rank's areas of slot (L - 1) % 3 -- the
// one the previous Lamport call read -- but only the units that call used (LamportState keeps
// that count), so no memset and no barrier.
//
// Why that re-fill is safe (rank B re-fills its slot (L-1)%3 during its call L):
//  1. B itself is done with it: B's call L-1 was an earlier kernel on the same stream, complete
//     once B passes wait_for_previous_kernel() (pdl.cuh, in begin_call), and the re-fill comes after.
//  2. No peer A still writes it for call L-1: B finished call L-1 only after it had received
//     every unit it expected, and A writes exactly those units (same counts on every rank), so
//     all of A's stores for L-1 had landed.
//  3. No peer A writes it for call L+2 (the next use of that slot) before the re-fill is done:
//     A stores anything for call L+2 only after its own wait, i.e. after finishing the group's
//     previous call, whose end waits for B's arrival packet of that call (call.cuh: arrive /
//     end_call; every group call counts, LL or Lamport). B sends that packet after its own
//     wait_for_previous_kernel(), i.e. after its call L -- the re-fill included -- completed.
//     So A's stores of call L+2 land after the sentinel. (A peer is at most one group call
//     ahead; the three slots give that call a slot nobody reads or re-fills meanwhile.)
//  4. B's polled loads are volatile (L1 bypassed), so they see the re-fill and then A's data,
//     never a stale line.
// Arrival packets are what bound a peer's lead when no data flows back (a rank with zero rows
// sends nothing), so they stay even though the data needs no flag. docs/lamport.md has the whole argument.
#pragma once

#include "lanes.cuh"
#include "pdl.cuh"
#include "reserved.cuh"
#include "rows.cuh"

namespace hc {

// -- units --------------------------------------------------------------------------------------

// A unit to a peer's area (nothing once aborted: CallCtx).
__device__ __forceinline__ void put_unit(const CallCtx& cx, uint4* dst, uint4 v) {
  if (!cx.aborted) store_unit_volatile(dst, v);
}

__device__ __forceinline__ bool try_get_unit(const uint4* src, uint4& v) {
  v = load_unit_volatile(src);
  return v.x != kSentinelWord && v.y != kSentinelWord && v.z != kSentinelWord && v.w != kSentinelWord;
}

// Unit i of a buffer holding `units` units, with the reserved pattern fixed; zeros beyond it.
template <typename T>
__device__ __forceinline__ uint4 load_unit(const uint4* __restrict__ p, int64_t i, int64_t units) {
  return i < units ? fix_reserved<T>(p[i]) : make_uint4(0, 0, 0, 0);
}

// The input units a thread works, unit index(k) for k < KU, loaded before the counts and
// arrive() so that their latency overlaps the prologue's (rows.cuh EarlyInput, for KU units:
// with one unit of them loaded in the send loop, a 7168-wide row's second round of sends waited
// for its load). Zeros at `size` and beyond; at(i) loads any other unit. Two orders:
//   kSendOrder: the grid-stride send loop's units, grid_thread() + k * grid_threads();
//   kRowOrder:  a block a row of `units` units, the block's first row: blockIdx.x * units +
//               threadIdx.x + k * blockDim.x.
enum class UnitOrder { kSendOrder, kRowOrder };

template <int KU, UnitOrder kOrder = UnitOrder::kSendOrder>
struct EarlyUnits {
  const uint4* __restrict__ in;
  int64_t size, units;  // units: a row's (kRowOrder only)
  uint4 first[KU];

  __device__ __forceinline__ int64_t index(int k) const {
    if constexpr (kOrder == UnitOrder::kSendOrder) return grid_thread() + k * grid_threads();
    return (int64_t)blockIdx.x * units + threadIdx.x + (int64_t)k * blockDim.x;
  }
  __device__ __forceinline__ uint4 at(int64_t i) const {
#pragma unroll
    for (int k = 0; k < KU; ++k)
      if (i == index(k)) return first[k];
    return i < size ? in[i] : make_uint4(0, 0, 0, 0);
  }
};

template <int KU, UnitOrder kOrder = UnitOrder::kSendOrder>
__device__ __forceinline__ EarlyUnits<KU, kOrder> early_units(const uint4* __restrict__ in, int64_t size,
                                                              int64_t units = 0) {
  EarlyUnits<KU, kOrder> e{in, size, units, {}};
#pragma unroll
  for (int k = 0; k < KU; ++k) {
    const int64_t i = e.index(k);
    e.first[k] = i < size ? in[i] : make_uint4(0, 0, 0, 0);
  }
  return e;
}

// -- calls --------------------------------------------------------------------------------------

struct LamportCall {
  CallCtx cx;            // the group call (arrival packets, deadline, errors)
  const LamportArgs& l;
  int slot;              // slot this call receives in (and sends to)
  int refill_slot;       // slot the previous Lamport call used: re-filled now
  int64_t refill_units;  // units per source area that call used
  bool refill_whole;     // that call recorded an error: re-fill its slot's areas whole (end_lamport_call)

  // Area of member `src` in `slot` of member `owner`'s Lamport part.
  __device__ __forceinline__ uint4* area(int owner, int slot_index, int src) const {
    return (uint4*)(l.bases[owner] + ((uint64_t)slot_index * cx.g.nranks + src) * l.area_bytes);
  }
  // My area that member `src` writes into this call.
  __device__ __forceinline__ uint4* inbox(int src) const { return area(cx.g.me, slot, src); }
  // Member `peer`'s area that I write into this call.
  __device__ __forceinline__ uint4* outbox(int peer) const { return area(peer, slot, cx.g.me); }
  // The fingerprint's algorithm field (abi.h kLamportOneShot): includes the slot, so peers
  // whose slots are out of step disagree instead of reading a stale slot.
  __device__ __forceinline__ int algorithm() const { return kLamportOneShot + slot; }
};

// The kernel prologue: the group call (begin_call does the PDL wait first, pdl.cuh), then the
// Lamport counters. The caller computes its counts and then calls arrive().
__device__ __forceinline__ LamportCall begin_lamport_call(const GroupArgs& g, const LamportArgs& l, int op) {
  const CallCtx cx = begin_call(g, op);
  // Read together, so their latencies overlap (the last block rewrites them at the end, after
  // every block has read them: end_call counts blocks in first).
  const uint32_t slot = *(volatile uint32_t*)&l.state[kLamportSlot];
  const uint32_t used = *(volatile uint32_t*)&l.state[kLamportUsedUnits];
  const uint32_t mismatched = *(volatile uint32_t*)&l.state[kLamportMismatched];
  return LamportCall{cx, l, (int)slot, (int)((slot + kLamportSlots - 1) % kLamportSlots), (int64_t)used,
                     mismatched != 0};
}

// Waits for unit i of every source s < n with wants(s) (member member_base + s) in my areas,
// polling them all at once; data[s] is written for those. Gives up like every wait (call.cuh).
template <int S, typename Wants>
__device__ __forceinline__ uint32_t wait_units(const LamportCall& lc, int n, int member_base, int64_t i, Wants wants,
                                               uint4 (&data)[S]) {
  return wait_all(
      lc.cx, n, member_base, wants, [&](int s) { return (const uint4*)lc.inbox(member_base + s) + i; },
      [](const uint4* p, uint4& v) { return try_get_unit(p, v); }, data);
}

// Unit i of members member_base .. member_base + n - 1 (the sources of one sum, in its order)
// into data[0 .. n). When `mine`, source `self` is me and its unit is `my`, my own contribution
// (fix_reserved applied, as to what I send); the others arrive in my areas. The receive step of
// every Lamport reduction.
__device__ __forceinline__ uint32_t receive_units(const LamportCall& lc, int n, int member_base, bool mine, int self,
                                                  int64_t i, uint4 my, uint4 (&data)[kMaxRanks]) {
#pragma unroll
  for (int s = 0; s < kMaxRanks; ++s) data[s] = my;  // kept for s == self
  return wait_units(lc, n, member_base, i, [&](int s) { return !(mine && s == self); }, data);
}

// Unit i of DP group od's partial rows from its tp ranks (members od * tp + s, s < tp, in tp
// order) into data[0 .. tp); when od is my group d (I am its tp rank t), my own is my_unit().
// d and t come from the caller, computed once: a division in here is not hoisted out of the
// callers' loops (+24-32 instructions a gather kernel).
template <typename MyUnit>
__device__ __forceinline__ uint32_t receive_group_units(const LamportCall& lc, int tp, int od, int d, int t, int64_t i,
                                                        MyUnit my_unit, uint4 (&data)[kMaxRanks]) {
  const bool mine = od == d;
  return receive_units(lc, tp, od * tp, mine, t, i, mine ? my_unit() : make_uint4(0, 0, 0, 0), data);
}

// My rows summed over every member in group order, fp32, rounded once: unit i (< count) of
// mine is in[offset + i] (in holds in_units units), the others' arrive in my areas; out holds
// out_units units. The receive side of reduce_scatter_v and scatter_tokens.
template <typename T>
__device__ __forceinline__ void reduce_my_rows(const LamportCall& lc, const uint4* __restrict__ in, int64_t in_units,
                                               int64_t offset, int64_t count, uint4* __restrict__ out,
                                               int64_t out_units) {
  const int n = lc.cx.g.nranks, me = lc.cx.g.me;
  for (int64_t i = grid_thread(); i < count; i += grid_threads()) {
    uint4 data[kMaxRanks];
    receive_units(lc, n, 0, true, me, i, load_unit<T>(in, offset + i, in_units), data);
    const uint4 r = sum_units<T>(data, n);
    if (i < out_units) out[i] = r;
  }
}

// Re-fill my areas of the previous call's slot with the sentinel (see the header comment).
// Called after this call's sends: it runs while their data is in flight.
__device__ __forceinline__ void refill_previous_slot(const LamportCall& lc) {
  const GroupArgs& g = lc.cx.g;
  const uint4 sentinel = make_uint4(kSentinelWord, kSentinelWord, kSentinelWord, kSentinelWord);
  const int64_t per_area = lc.refill_units, total = per_area * (g.nranks - 1);
  grid_stride_divided(total, per_area, [&](int64_t k, int64_t u) {
    const int src = (int)k < g.me ? (int)k : (int)k + 1;  // every member but me
    lc.area(g.me, lc.refill_slot, src)[u] = sentinel;
  });
}

// Every block ends here (call.cuh end_call); the last block also advances the Lamport slot and
// remembers how many units per source area this call used (what the next Lamport call
// re-fills). Nobody reads these words again in this kernel, and the next kernel reads them
// after its PDL wait, i.e. after this kernel completed.
//
// After a call whose ranks disagreed (ArgumentMismatch: other counts or widths), a peer may
// have written more units into my areas than I expected -- beyond what the normal re-fill
// covers -- and may still have been writing when I finished. So that call records it, and the
// next Lamport call's last block re-fills the previous slot's areas whole. Safe there: block
// 0's arrival wait has seen every peer start this call, so they finished the previous one and
// its stores have landed; and they write that slot again only two calls later. (Rare and slow:
// one block, whole areas.) Ranks that ran different protocols in one call get out of step for
// good: see docs/lamport.md.
//
// The error word is read after a fence only in a grid of several blocks (other blocks' errors);
// a one-block grid's own threads recorded theirs before end_call's barriers, which make them
// visible to thread 0. Blocks need no fence of their own before they count (end_call's
// kOrdered): the error word is written only by atomicCAS (CallCtx::fail, fingerprint_disagrees),
// which the recording thread waits for -- it tests the returned value -- before it reaches
// end_call's barrier and its block's count, and the winner fences it too; so a last block that
// has counted every block, then fences, reads every recorded error. The fence in every block cost
// the multi-block Lamport calls ~1 us: it waits for the block's NVLink stores to be acknowledged
// (trace, 2x H200, quant_lamport fp8 1 token: last-block count 1.8 us, LL's 0.65).
__device__ __forceinline__ void end_lamport_call(const LamportCall& lc, int64_t used_units) {
  end_call</*kOrdered=*/false>(lc.cx, [&] {
    const GroupArgs& g = lc.cx.g;
    if (lc.refill_whole) {
      const uint4 sentinel = make_uint4(kSentinelWord, kSentinelWord, kSentinelWord, kSentinelWord);
      uint4* slot = lc.area(g.me, lc.refill_slot, 0);  // the slot's areas back to back
      const int64_t units = (int64_t)g.nranks * (int64_t)(lc.l.area_bytes / kLamportUnitBytes);
      for (int64_t j = threadIdx.x; j < units; j += blockDim.x) slot[j] = sentinel;
    }
    if (threadIdx.x == 0) {
      if (gridDim.x > 1) __threadfence();  // errors recorded by other blocks (end_call fenced them before counting)
      const uint32_t code = (uint32_t)(*(volatile unsigned long long*)g.error_word & kErrorFieldMask);
      // Any recorded error, not only kArgumentMismatch: the first error wins the word, and a
      // capacity error may hide a disagreement. Rare, so the whole re-fill costs little.
      lc.l.state[kLamportMismatched] = code != kOk;
      lc.l.state[kLamportUsedUnits] = (uint32_t)used_units;
      lc.l.state[kLamportSlot] = (uint32_t)((lc.slot + 1) % kLamportSlots);
    }
  });
}

// Row counts checked against the Lamport area (rows.cuh load_counts_checked for the LL areas):
// on overflow every rank reaches the same verdict, nobody sends or waits, the host raises
// CapacityExceeded.
__device__ __forceinline__ RowCounts lamport_counts(const LamportCall& lc, const SizesArg& s, int n,
                                                    int64_t row_units) {
  RowCounts rc = load_counts(s, n);
  if (!fits_area(rc.max * row_units * kLamportUnitBytes, kLamportWireFactor, lc.l.area_bytes)) {
    if (grid_thread() == 0) lc.cx.fail(kCapacity, lc.cx.g.me);
    const uint32_t hash = rc.hash;
    rc = RowCounts{};
    rc.hash = hash;
  }
  return rc;
}

}  // namespace hc
