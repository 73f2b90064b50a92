// The bulk protocol: plain stores, then one release flag per block.
//
// For large messages, where LL's 2x bytes cost more than a flag round trip. A block writes
// its share to a peer with ordinary 16-byte stores, then (after a barrier) one thread per
// peer fences and stores the call's flag into that peer's flag for (phase, me, block). The
// peer's block waits for the flags of all sources, then reads with L1 bypassed. Flags only
// grow, so waiting is "flag >= this call's flag".
//
// A receiver zeroes the bulk data it consumed: LL packets of a later call land in the same
// areas, and stale plain data must never look like a packet carrying that call's flag.
#pragma once

#include "call.cuh"

namespace hc {

__device__ __forceinline__ uint32_t* block_flag(char* region, int phase, int src, int block) {
  return (uint32_t*)(region + kArrivalBytes) + ((size_t)phase * kMaxRanks + src) * kMaxBlocks + block;
}

// Publishes `flag` at `f` (a peer's flag word) after every store this block made before: the
// caller's __syncthreads() orders the block's stores before this thread's fence.
__device__ __forceinline__ void release_flag(uint32_t* f, uint32_t flag) {
  __threadfence_system();
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(f), "r"(flag) : "memory");
}

// Spins until the flag word at `f` (in my memory) reaches this call's flag, giving up as
// cx.give_up(member) says. Flags only grow, so "reached" is a wrap-safe >=.
__device__ __forceinline__ void wait_flag(const CallCtx& cx, const uint32_t* f, int member) {
  int spins = 0;
  while (true) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(f) : "memory");
    if ((int32_t)(v - cx.flag) >= 0) break;
    if ((++spins & (kPollsPerCheck - 1)) == 0 && cx.give_up(member)) break;
  }
}

// This block's stores of `phase` are done: release them to every peer, unless a thread of the
// block aborted (what it stored may come from a wait that gave up: CallCtx).
__device__ __forceinline__ void signal_block(const CallCtx& cx, int phase) {
  const GroupArgs& g = cx.g;
  if (cx.block_aborted()) return;  // (a barrier: the block's stores happen before the fence below)
  if (threadIdx.x < g.nranks && threadIdx.x != g.me)
    release_flag(block_flag(g.regions[threadIdx.x], phase, g.me, blockIdx.x), cx.flag);
}

// Waits until the same block of every peer has released `phase`.
__device__ __forceinline__ void wait_block(const CallCtx& cx, int phase) {
  const GroupArgs& g = cx.g;
  HC_TRACE_EVENT_ONCE(kTraceWaitBegin);
  if (threadIdx.x < g.nranks && threadIdx.x != g.me)
    wait_flag(cx, block_flag(g.regions[g.me], phase, threadIdx.x, blockIdx.x), threadIdx.x);
  __syncthreads();
  HC_TRACE_EVENT(kTraceWaitEnd);
}

// Read a unit a peer wrote (L2, not a possibly stale L1 line), then zero it (see above).
__device__ __forceinline__ uint4 take_unit(uint4* p) {
  uint4 v = __ldcg(p);
  __stcg(p, make_uint4(0, 0, 0, 0));
  return v;
}

}  // namespace hc
