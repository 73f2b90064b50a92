// The call context: what every kernel sets up once and every device helper needs.
//
// Flags are a per-group call counter kept in device memory (GroupState kCalls): every call
// reads it, uses calls + 1 as its flag, and the last block to finish stores calls + 1. So a
// CUDA graph replays with fresh flags and never needs host fix-ups. Receive areas rotate
// over two slots (flag parity); an arrival flag per peer makes sure a fast rank never
// writes a slot its peer may still read (begin_call / end_call).
//
// Every wait has a deadline. On expiry the waiting thread records (code, op, group, peer)
// in an error word mirrored to pinned host memory and raises the group's abort flag; every
// other wait then gives up at once, the kernel finishes, and the host raises PeerTimeout on
// its next call. See docs/architecture.md ("The kernel protocols").
#pragma once

#include "abi.h"

namespace hc {

__device__ __forceinline__ int64_t grid_thread() { return (int64_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_threads() { return (int64_t)gridDim.x * blockDim.x; }

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Region layout: [flags][slot 0: area A x n, area B x n][slot 1: same].
__device__ __forceinline__ uint32_t* arrival_flags(char* region) { return (uint32_t*)region; }

// Group members base .. base + count - 1, `self` being my index among them.
struct Members {
  int base, count, self;

  // f(member) for every other member, staggered from mine so that peers are not all hit at once.
  template <typename F>
  __device__ __forceinline__ void for_each_other(F f) const {
    for (int k = 1; k < count; ++k) f(base + (self + k) % count);
  }
};

// One call of one kernel on one group: made once by begin_call, passed to every helper.
struct CallCtx {
  const GroupArgs& g;
  uint32_t flag;      // this call's flag: completed calls + 1
  int slot;           // which of the two rotating slots this call uses
  uint64_t deadline;  // global timer value at which waits give up
  int op;             // Op code, for error reports

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
  __device__ __forceinline__ void fail(uint32_t code, int member) const {
    unsigned long long word = pack_error(code, op, g.group_id, g.world_ranks[member]);
    if (atomicCAS(g.error_word, 0ull, word) == 0ull) {
      *(volatile unsigned long long*)g.error_mirror = word;
      __threadfence_system();
    }
    if (code == kTimeout) atomicExch(&g.state[kAborted], 1u);
  }

  // True when a wait should stop: the group already aborted, or time ran out (recorded
  // against `member`, the peer being waited for).
  __device__ __forceinline__ bool give_up(int member) const {
    if (*(volatile uint32_t*)&g.state[kAborted]) return true;
    if (global_timer_ns() < deadline) return false;
    fail(kTimeout, member);
    return true;
  }
};

// Every kernel starts here. Block 0 tells every peer "I have started call `flag`", hence
// finished reading call flag - 1.
__device__ __forceinline__ CallCtx begin_call(const GroupArgs& g, int op) {
  const uint32_t flag = *(volatile uint32_t*)&g.state[kCalls] + 1;
  const CallCtx cx{g, flag, (int)(flag & 1), global_timer_ns() + g.timeout_ns, op};  // read in this order
  if (blockIdx.x == 0 && threadIdx.x < g.nranks && threadIdx.x != g.me) {
    volatile uint32_t* dst = arrival_flags(g.regions[threadIdx.x]) + g.me;
    *dst = cx.flag;
  }
  return cx;
}

// Block 0 waits until every peer has started this call. A peer that is one call ahead has
// already overwritten the flag with flag + 1, hence the signed comparison.
__device__ __forceinline__ void wait_arrivals(const CallCtx& cx) {
  const GroupArgs& g = cx.g;
  if (blockIdx.x == 0 && threadIdx.x < g.nranks && threadIdx.x != g.me) {
    volatile uint32_t* src = arrival_flags(g.regions[g.me]) + threadIdx.x;
    int spins = 0;
    while ((int32_t)(*src - cx.flag) < 0) {
      if ((++spins & 63) == 0 && cx.give_up(threadIdx.x)) break;
    }
  }
}

// Every kernel ends here; the last block to finish publishes the call as completed.
__device__ __forceinline__ void end_call(const CallCtx& cx) {
  const GroupArgs& g = cx.g;
  wait_arrivals(cx);
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t before = atomicAdd(&g.state[kBlocksDone], 1u);
    if (before == gridDim.x - 1) {
      g.state[kBlocksDone] = 0;
      *(volatile uint32_t*)&g.state[kCalls] = cx.flag;
    }
  }
}

}  // namespace hc
