// Moving lanes with LL packets: push to peers, wait for one or several sources. Waits give up
// on the call's deadline, on the group's abort flag, and on a peer whose call disagrees with
// mine (CallCtx::give_up), so a wait never outlives a broken call.
#pragma once

#include "call.cuh"

namespace hc {

// Lane i of my payload to member `peer`'s area `phase` (nothing once aborted: CallCtx).
__device__ __forceinline__ void put_lane(const CallCtx& cx, int peer, int phase, int64_t i, uint2 v) {
  if (!cx.aborted) Packet::put(cx.outbox(peer, phase) + i, v, cx.flag);
}

// Lane i, the same value, to every other member of `to`.
__device__ __forceinline__ void push_to_peers(const CallCtx& cx, const Members& to, int phase, int64_t i, uint2 v) {
  to.for_each_other([&](int peer) { put_lane(cx, peer, phase, i, v); });
}

// Waits for lane i from member `member` in my area `phase`.
__device__ __forceinline__ uint2 wait_lane(const CallCtx& cx, int phase, int member, int64_t i) {
  const uint4* src = cx.inbox(phase, member) + i;
  uint2 data = make_uint2(0, 0);
  int spins = 0;
  HC_TRACE_EVENT_ONCE(kTraceWaitBegin);
  while (!Packet::try_get(src, cx.flag, data)) {
    if ((++spins & (kPollsPerCheck - 1)) == 0 && cx.give_up(member)) break;
  }
  HC_TRACE_EVENT(kTraceWaitEnd);
  return data;
}

// Waits for lane i from every source s < n with wants(s) (source s is group member
// member_base + s), polling them all at once: a sequential wait would add one memory latency
// per source. data[s] is written for the sources waited for; returns their bit mask.
template <typename Wants>
__device__ __forceinline__ uint32_t wait_sources(const CallCtx& cx, int phase, int n, int member_base, int64_t i,
                                                 Wants wants, uint2 (&data)[kMaxRanks]) {
  return wait_all(
      cx, n, member_base, wants, [&](int s) { return (const uint4*)cx.inbox(phase, member_base + s) + i; },
      [&](const uint4* p, uint2& v) { return Packet::try_get(p, cx.flag, v); }, data);
}

}  // namespace hc
