// The call context: what every kernel sets up once and every device helper needs.
//
// Flags are a per-group call counter kept in device memory (GroupState kCalls): every call
// reads it, uses calls + 1 as its flag, and the last block to finish stores calls + 1. So a
// CUDA graph replays with fresh flags and never needs host fix-ups. Receive areas rotate
// over two slots (flag parity); an arrival packet per peer makes sure a fast rank never
// writes a slot its peer may still read (arrive / end_call).
//
// The arrival packet also carries the call's fingerprint (abi.h make_fingerprint): op, dtype,
// algorithm, row width, row counts. A rank that finds a peer's fingerprint different from its
// own records kArgumentMismatch (which field, which peer) and stops waiting for that peer, so
// a call whose ranks disagree finishes, within its buffers, and the host raises
// ArgumentMismatch. Checked where waits already spin and once in end_call: free when all agree.
//
// Every wait has a deadline. On expiry the waiting thread records (code, op, group, peer)
// in an error word mirrored to pinned host memory and raises the group's abort flag; every
// other wait then gives up at once, the kernel finishes, and the host raises PeerTimeout on
// its next call. See docs/architecture.md ("The kernel protocols").
#pragma once

#include "abi.h"
#include "divide.cuh"
#include "packet.cuh"
#include "pdl.cuh"
#include "trace.cuh"

namespace hc {

__device__ __forceinline__ int64_t grid_thread() { return (int64_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_threads() { return (int64_t)gridDim.x * blockDim.x; }

// f(q, r) for this thread's items x = grid_thread(), + grid_threads(), ... below total, with
// (q, r) = divmod(x, d): one division for the first item, one more for the stride where a second
// follows, then a step of adds an item. A division an item recomputed the divisor's reciprocal
// every time (~20 instructions; with the row search after it, 16% of a quantized Lamport
// gather's instructions at 256 tokens: ncu, run 81 of results/shared_1xH100). A thread of a small
// call, one item or none, divides once, as before. q never decreases from one item to the next.
template <typename F>
__device__ __forceinline__ void grid_stride_divided(int64_t total, int64_t d, F f) {
  int64_t x = grid_thread();
  if (x >= total) return;
  QuotRem at = divmod(x, d);
  f(at.q, at.r);
  const int64_t stride = grid_threads();
  if (x + stride >= total) return;
  const QuotRem step = divmod(stride, d);
  for (x += stride; x < total; x += stride) {
    at.q += step.q;
    at.r += step.r;
    if (at.r >= d) {
      at.r -= d;
      ++at.q;
    }
    f(at.q, at.r);
  }
}

// Polls of a wait between two give_up checks. A check reads the abort flag, the peer's arrival
// packet and the clock, one after the other; data landing meanwhile is seen only after it.
// 64 polls of local memory take several µs: a deadline or an abort is still noticed at once.
constexpr int kPollsPerCheck = 64;
static_assert((kPollsPerCheck & (kPollsPerCheck - 1)) == 0, "a power of two: the waits test it with a mask");

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Region layout: [arrival packets][count packets][bulk flags][slot 0: area A x n, area B x n]
// [slot 1: same]. Source `src`'s arrival packet for calls of slot `slot`.
__device__ __forceinline__ uint4* arrival_packet(char* region, int slot, int src) {
  return (uint4*)region + slot * kMaxRanks + src;
}

// Source `src`'s count packet (its own row count, own_count.cuh) for calls of slot `slot`.
// It rotates like the arrival packet beside it, and the same argument (arrive) keeps a fast
// peer from overwriting it before it is read.
__device__ __forceinline__ uint4* count_packet(char* region, int slot, int src) {
  return (uint4*)region + (2 + slot) * kMaxRanks + src;
}

// What the cold path of a wait needs to check a peer's fingerprint, in shared memory rather
// than in every thread's registers (the waits are where registers run short). Set by arrive.
struct Agreement {
  uint64_t fingerprint;        // this call's
  const uint4* arrivals;       // my region's arrival packets for this call's slot
  unsigned long long error;    // the error word of a mismatch, without peer and detail
  unsigned long long* error_word;
  unsigned long long* error_mirror;
};

__device__ __forceinline__ Agreement& agreement() {
  __shared__ Agreement a;
  return a;
}

// Whether `theirs`, the fingerprint in an arrival packet from global rank `rank`, differs
// from mine; if so records kArgumentMismatch with the first field that differs. (Inline: with
// its state in shared memory no kernel spills; out of line, the call made the register-bound
// ones spill.)
__device__ __forceinline__ bool fingerprint_disagrees(uint2 theirs, int rank) {
  const Agreement& a = agreement();
  const int field = first_difference(a.fingerprint, ((uint64_t)theirs.y << 32) | theirs.x);
  if (!field) return false;
  const unsigned long long word = a.error | ((unsigned long long)(rank & kErrorPeerMask) << kErrorPeerShift) |
                                  ((unsigned long long)field << kErrorDetailShift);
  if (atomicCAS(a.error_word, 0ull, word) == 0ull) {
    *(volatile unsigned long long*)a.error_mirror = word;
    __threadfence_system();
  }
  return true;
}

// Whether `member` (global rank `rank`) has sent its arrival for call `flag` with a fingerprint
// other than mine (then recorded). Called every few dozen polls of a wait, never on the way of data.
__device__ __forceinline__ bool arrival_disagrees(int member, int rank, uint32_t flag) {
  uint2 theirs;
  return Packet::try_get(agreement().arrivals + member, flag, theirs) && fingerprint_disagrees(theirs, rank);
}

// Group members base .. base + count - 1, `self` being my index among them.
struct Members {
  int base, count, self;

  // f(member) for every other member, staggered from mine so that peers are not all hit at once.
  template <typename F>
  __device__ __forceinline__ void for_each_other(F f) const {
    for (int k = 1; k < count; ++k) {
      const int m = self + k;  // (self + k) % count, without a division per peer
      f(base + (m < count ? m : m - count));
    }
  }
};

// One call of one kernel on one group: made once by begin_call, passed to every helper.
struct CallCtx {
  const GroupArgs& g;
  uint32_t flag;      // this call's flag: completed calls + 1
  int slot;           // which of the two rotating slots this call uses
  uint64_t deadline;  // global timer value at which waits give up
  int op;             // Op code, for error reports
  // This thread sends nothing more (put_lane, put_unit, the release flags, the arrival): a
  // timeout came before this call (a rank's calls after a PeerTimeout, such as the graph replays
  // after one: begin_call), or a wait of this thread gave up on time. What a rank computed from
  // data that never came must not reach a peer as data: the peer waits instead, times out and
  // raises too.
  mutable bool aborted;

  __device__ __forceinline__ Members everyone() const { return Members{0, g.nranks, g.me}; }

  // The area where `src` puts its packets for the owner of `region` (A: phase 0, B: phase 1).
  __device__ __forceinline__ uint4* area(char* region, int phase, int src) const {
    uint64_t index = ((uint64_t)slot * 2 + phase) * g.nranks + src;
    return (uint4*)(region + kFlagBytes + index * g.area_bytes);
  }
  // My area `phase` that member `src` writes into.
  __device__ __forceinline__ uint4* inbox(int phase, int src) const { return area(g.regions[g.me], phase, src); }
  // Member `peer`'s area `phase` that I write into.
  __device__ __forceinline__ uint4* outbox(int peer, int phase) const { return area(g.regions[peer], phase, g.me); }

  // Records (code, op, group, member's global rank); the first error wins. The CAS is on
  // device memory (atomics on host memory need PCIe atomics); the winner copies the word to
  // the host-visible mirror with a plain store.
  // `detail`: kArgumentMismatch's CallField.
  __device__ __forceinline__ void fail(uint32_t code, int member, int detail = 0) const {
    unsigned long long word = pack_error(code, op, g.group_id, g.world_ranks[member], detail);
    if (atomicCAS(g.error_word, 0ull, word) == 0ull) {
      *(volatile unsigned long long*)g.error_mirror = word;
      __threadfence_system();
    }
    // A timeout ends the group: every other wait gives up at once.
    if (code == kTimeout) atomicExch(&g.state[kAborted], 1u);
  }

  // Whether member's arrival packet for this call is here and says its call differs from
  // mine (then recorded, with the first field that differs).
  __device__ __forceinline__ bool disagrees(int member) const {
    return arrival_disagrees(member, g.world_ranks[member], flag);
  }

  // True when a wait for `member` should stop: the group already aborted, member's call
  // differs from mine, or time ran out (recorded against member, the peer being waited for).
  __device__ __forceinline__ bool give_up(int member) const {
    if (*(volatile uint32_t*)&g.state[kAborted]) return aborted = true;
    if (disagrees(member)) return true;  // (both sides record it and stay in step: sends go on)
    if (global_timer_ns() < deadline) return false;
    fail(kTimeout, member);
    return aborted = true;
  }

  // Block-wide: whether any thread of the block has aborted, made every thread's own. Called by
  // the whole block before it sends what its threads computed together (a norm, a row's scale).
  __device__ __forceinline__ bool block_aborted() const { return aborted = __syncthreads_or(aborted) != 0; }
};

// Waits for one item from every source s < n with wants(s), polling them all at once (a
// sequential wait would add one memory latency per source): addr(s) is where source s's item
// lands, try_get(p, item) reads it and says whether it has arrived (the protocol's test).
// Source s is group member member_base + s. data[s] is written for the sources waited for;
// returns their bit mask. Gives up when cx.give_up says so. S, the size of data, bounds n: a
// wait for one source passes data[1], so its poll is one load, not kMaxRanks predicated ones
// (unrolled over kMaxRanks, the one-source receive of the quantized Lamport gather issued
// ~110 instructions a poll: ncu, run 81 of results/shared_1xH100).
template <typename Item, int S, typename Wants, typename Addr, typename TryGet>
__device__ __forceinline__ uint32_t wait_all(const CallCtx& cx, int n, int member_base, Wants wants, Addr addr,
                                             TryGet try_get, Item (&data)[S]) {
  static_assert(S >= 1 && S <= kMaxRanks, "a source a slot, at most kMaxRanks");
  const uint4* src[S];
  uint32_t pending = 0;
#pragma unroll
  for (int s = 0; s < S; ++s) {
    src[s] = nullptr;
    if (s < n && wants(s)) {
      src[s] = addr(s);
      pending |= 1u << s;
    }
  }
  const uint32_t waited = pending;
  if (waited) HC_TRACE_EVENT_ONCE(kTraceWaitBegin);
  int spins = 0;
  while (pending) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      if ((pending >> s) & 1u) {
        if (try_get(src[s], data[s])) pending &= ~(1u << s);
      }
    }
    if (pending && (++spins & (kPollsPerCheck - 1)) == 0 && cx.give_up(member_base + __ffs(pending) - 1)) break;
  }
  if (waited) HC_TRACE_EVENT(kTraceWaitEnd);
  return waited;
}

// f(s) for every source s whose bit `received` (wait_all's mask) has, in source order. The loop
// is unrolled over kMaxRanks, so that data[s] stays in registers; it ends after the highest set
// bit: a slot above it would still issue its test and a predicated body (with 2 of 8 slots in
// use, the bf16 Lamport gather's store loop was 14% of its instructions: ncu, run 82 of
// results/shared_1xH100). wait_all's poll loop does not end so: there the early exit made ptxas
// spill in the LL fused gather (72 / 98 bytes), which then ran 1.08-1.22x slower (run 82).
template <typename F>
__device__ __forceinline__ void for_each_received(uint32_t received, F f) {
#pragma unroll
  for (int s = 0; s < kMaxRanks; ++s) {
    if ((received >> s) == 0) return;
    if ((received >> s) & 1u) f(s);
  }
}

// Every kernel starts here; it must call arrive() before its first wait. First the PDL wait
// (pdl.cuh): everything below touches memory the previous kernel may still use (the group's
// counters, the areas, the inputs, the counts), and the deadline starts after it.
__device__ __forceinline__ CallCtx begin_call(const GroupArgs& g, int op) {
  HC_TRACE_ENTRY();
  wait_for_previous_kernel();
  allow_next_kernel();
  HC_TRACE_READY();
  const uint32_t flag = *(volatile uint32_t*)&g.state[kCalls] + 1;
  // A timeout before this call, in this group or in any group of the communicator (a composed
  // op's second kernel works on what its first left): send nothing (CallCtx::aborted).
  // Both words are read unconditionally so that the two loads are in flight together: with `||`
  // the second load waited for the first, one more memory latency before every call's first
  // send (the one-shot all_reduce of 2-32 KB: 0.3-0.5 us with two ranks sharing an H100,
  // results/shared_1xH100 run 34; sass_oneshot_prologue.txt there).
  const uint32_t group_aborted = *(volatile uint32_t*)&g.state[kAborted];
  const unsigned long long error = *(volatile unsigned long long*)g.error_word;
  const bool aborted = group_aborted != 0 || (error & kErrorFieldMask) == kTimeout;
  return CallCtx{g, flag, (int)(flag & 1), global_timer_ns() + g.timeout_ns, op, aborted};  // read in this order
}

// Block 0 tells every peer "I have started call `flag`" (hence finished reading call flag - 1)
// and what the call is. Peers start with the same slot pattern, and a peer is at most one call
// ahead (its end_call waited for my arrival), so my packet for this slot is read before I
// overwrite it two calls later.
__device__ __forceinline__ void arrive(const CallCtx& cx, uint64_t fingerprint) {
  const GroupArgs& g = cx.g;
  // Every thread stores the same values, before its own first wait: no barrier needed.
  agreement() = Agreement{fingerprint, arrival_packet(g.regions[g.me], cx.slot, 0),
                          pack_error(kArgumentMismatch, cx.op, g.group_id, 0), g.error_word, g.error_mirror};
  if (blockIdx.x == 0 && threadIdx.x < g.nranks && threadIdx.x != g.me && !cx.aborted) {
    Packet::put(arrival_packet(g.regions[threadIdx.x], cx.slot, g.me),
                make_uint2((uint32_t)fingerprint, (uint32_t)(fingerprint >> 32)), cx.flag);
  }
  HC_TRACE_EVENT(kTraceArrived);
}

// Block 0 waits until every peer has started this call, and checks that it is the same call,
// from the packet it polled (no second load). The waiting threads are the last warp's: in a
// small call that warp holds no data and reaches end_call at once, so this wait overlaps the
// other warps' wait for data instead of following it.
__device__ __forceinline__ void wait_arrivals(const CallCtx& cx) {
  const GroupArgs& g = cx.g;
  const int member = (int)threadIdx.x - (int)(blockDim.x - kMaxRanks);  // the last kMaxRanks threads
  if (blockIdx.x == 0 && member >= 0 && member < g.nranks && member != g.me) {
    const uint4* src = arrival_packet(g.regions[g.me], cx.slot, member);
    uint2 theirs;
    int spins = 0;
    bool arrived;
    while (!(arrived = Packet::try_get(src, cx.flag, theirs))) {
      if ((++spins & (kPollsPerCheck - 1)) == 0 && cx.give_up(member)) break;
    }
    if (arrived) fingerprint_disagrees(theirs, g.world_ranks[member]);
  }
}

// Every kernel ends here; the last block to finish publishes the call as completed.
// `on_last()` runs just before, in every thread of that block, after block 0's arrival wait:
// every peer has started this call (a protocol's own per-group state: lamport.cuh).
// A grid of one block (every small message) is its own last block: it skips the fence and the
// count, a device-wide fence and an atomic round trip on the way out. Nothing needs them: the
// count exists to find the last block, and what the block wrote reaches the next kernel through
// the kernel boundary (its PDL wait returns once this kernel is complete and its writes visible).
// For the same reason a block of a larger grid fences its writes before it counts only when
// on_last reads what other blocks wrote with plain stores (kOrdered; the Lamport state reads only
// the error word, written by atomics: lamport.cuh end_lamport_call); the
// fence waits for the block's stores to peers to be acknowledged over NVLink, most of the ~1 us
// a several-block grid spent counting (trace, 2x H200: 8 blocks 0.9-1.0 us, 1 block 0.15 us).
template <bool kOrdered = true, typename OnLast>
__device__ __forceinline__ void end_call(const CallCtx& cx, OnLast on_last) {
  const GroupArgs& g = cx.g;
  __shared__ bool last;
  HC_TRACE_EVENT(kTraceEndBegin);
  wait_arrivals(cx);
  __syncthreads();
  HC_TRACE_EVENT(kTraceArrivals);
  if (threadIdx.x == 0) {
    if (gridDim.x == 1) {
      last = true;
    } else {
      if (kOrdered) __threadfence();  // this block's writes (errors recorded included) before its count
      last = atomicAdd(&g.state[kBlocksDone], 1u) == gridDim.x - 1;
    }
  }
  __syncthreads();
  HC_TRACE_EVENT(kTraceCounted);
  if (!last) {
    HC_TRACE_FLUSH(cx.op, cx.flag, g.me);
    return;
  }
  on_last();
  __syncthreads();
  if (threadIdx.x == 0) {
    g.state[kBlocksDone] = 0;
    *(volatile uint32_t*)&g.state[kCalls] = cx.flag;
  }
  HC_TRACE_FLUSH(cx.op, cx.flag, g.me);
  HC_TRACE_LAST(cx.flag);
}

__device__ __forceinline__ void end_call(const CallCtx& cx) {
  end_call</*kOrdered=*/false>(cx, [] {});
}

}  // namespace hc
