// Counts from one's own count, inside the call (README "Counts"; counts.py).
//
// A gather given only this rank's own row count (SizesArg::own, device memory) exchanges it
// with the group in the same kernel, so an engine that knows only its own token count needs no
// extra collective before the gather and a captured graph replays with new counts:
//
//  1. counted<true> gives the counts as my own count, the others zero for now, so the protocol's
//     usual loader checks it against my input buffer and the area like any count. The
//     fingerprint's counts field says "own-count mode" (kOwnCountsHash): a rank given all
//     counts disagrees with it.
//  2. publish_own_count, beside the arrival packet (block 0, one thread per peer): my count
//     packet, an LL packet carrying (count, whether it fits), in every peer's region.
//  3. My sends need only my own count (rows are indexed by their place in my group's rows),
//     so they go first; then learn_counts waits for every member's count packet and turns
//     them into counts and offsets for the receive side. The count and its flag travel in one
//     16-byte store (LL), so a count is whole once its flag is this call's.
//  4. Block 0 writes the learned counts to SizesArg::learned: the scatter that follows reads
//     them after its PDL wait, i.e. after this kernel completed.
// Kernels take own-count mode as a template parameter (kOwn): their instances for given
// counts are the code they were before, without a branch or a register more.
//
// Members of one entry (the attn-TP ranks of one DP group of a token transition) must publish
// the same count. Every rank sees every member's packet, so every rank reaches the same
// verdict: ranks that differ -> kArgumentMismatch (field counts) naming the first member that
// differs from its group's first; a count that did not fit (the sender's buffer or the area)
// -> kCapacity naming that member. Then nobody waits for rows (the counts become zero), so the
// call ends within its buffers on every rank and the host raises on every rank; rows already
// sent are dropped (Lamport areas holding them are re-filled whole by the next Lamport call,
// lamport.cuh end_lamport_call, since an error was recorded).
#pragma once

#include "rows.cuh"

namespace hc {

enum OwnCountStatus : uint32_t { kCountTooLarge = 0, kCountFits = 1, kCountLost = 2 /* local: wait gave up */ };

// The fingerprint's counts field in own-count mode: the others' counts are unknown when the
// fingerprint leaves, so it says only "own-count mode" (a rank given all counts hashes them,
// and differs from this with odds 1 - 2^-16).
constexpr uint32_t kOwnCountsHash = 0x0c0c;

// Step 1: the row arguments to load counts from. Own-count mode: my own count as entry `mine`
// of given counts, the others zero (clamped at 0 like device counts); else `io` as it is.
template <bool kOwn>
__device__ __forceinline__ RowsArg counted(const RowsArg& io, int mine) {
  if constexpr (!kOwn) return io;
  RowsArg r = io;
  const int32_t own = max(*io.sizes.own, 0);
  r.sizes.device = nullptr;
#pragma unroll
  for (int i = 0; i < kMaxRanks; ++i) r.sizes.host[i] = i == mine ? own : 0;
  return r;
}

// What I publish: my own count (clamped at 0 like device counts), and whether it fits my input
// buffer and the area (load_counts_checked zeroed my entry if not).
__device__ __forceinline__ uint2 own_count_word(const RowsArg& io, const RowCounts& rc, int mine) {
  const int64_t own = max(*io.sizes.own, 0);
  return make_uint2((uint32_t)own, rc.count[mine] == own && own <= io.in_rows ? kCountFits : kCountTooLarge);
}

// Step 2: after arrive(), with the counts as loaded (my entry `mine`).
__device__ __forceinline__ void publish_own_count(const CallCtx& cx, const RowsArg& io, const RowCounts& rc,
                                                  int mine) {
  const GroupArgs& g = cx.g;
  if (blockIdx.x != 0 || threadIdx.x >= g.nranks || threadIdx.x == g.me) return;
  Packet::put(count_packet(g.regions[threadIdx.x], cx.slot, g.me), own_count_word(io, rc, mine), cx.flag);
}

// Step 3: every member's count into `rc` (entries of `tp` members each), after my sends. Every
// thread of every block calls it (a block barrier).
__device__ __forceinline__ void learn_counts(const CallCtx& cx, const RowsArg& io, int tp, RowCounts& rc) {
  const GroupArgs& g = cx.g;
  const int entries = g.nranks / tp;
  __shared__ uint2 words[kMaxRanks];
  if (threadIdx.x < g.nranks) {
    uint2 w = own_count_word(io, rc, g.me / tp);
    if (threadIdx.x != g.me) {
      const uint4* src = count_packet(g.regions[g.me], cx.slot, threadIdx.x);
      int spins = 0;
      while (!Packet::try_get(src, cx.flag, w)) {
        if ((++spins & 63) == 0 && cx.give_up(threadIdx.x)) {  // recorded there (timeout, mismatch)
          w = make_uint2(0, kCountLost);
          break;
        }
      }
    }
    words[threadIdx.x] = w;
  }
  __syncthreads();
  // The verdict, from the first member (in group order) with a problem: kTimeout stands for
  // "my wait gave up" (already recorded; nothing more to record).
  uint32_t code = kOk;
  int culprit = 0;
#pragma unroll
  for (int m = 0; m < kMaxRanks; ++m) {
    if (m >= g.nranks || code != kOk) continue;
    const uint2 w = words[m];
    if (w.y == kCountLost) code = kTimeout;
    else if (w.x != words[m - m % tp].x) code = kArgumentMismatch;
    else if (w.y != kCountFits) code = kCapacity;
    culprit = m;
  }
#pragma unroll
  for (int e = 0; e < kMaxRanks; ++e) rc.count[e] = e < entries && code == kOk ? (int64_t)words[e * tp].x : 0;
  count_offsets(rc, entries);
  if (blockIdx.x == 0 && threadIdx.x < entries) io.sizes.learned[threadIdx.x] = (int32_t)words[threadIdx.x * tp].x;
  if (grid_thread() == 0 && (code == kArgumentMismatch || code == kCapacity))
    cx.fail(code, culprit, code == kArgumentMismatch ? kFieldCounts : 0);
  check_buffers(cx, rc.offset[kMaxRanks] > io.out_rows);  // (= offset[entries]: the rest count zero)
}

}  // namespace hc
