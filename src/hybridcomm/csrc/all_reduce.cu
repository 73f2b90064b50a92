// all_reduce over a group: one-shot for small messages, two-shot above.
//
// one-shot: every rank pushes its whole input to every peer; each rank sums all n inputs.
//   One NVLink hop of latency; (n-1) x message bytes leave every GPU.
// two-shot: rank j owns chunk j. Phase 1 pushes chunk j of the input to rank j, which sums
//   it; phase 2 pushes the summed chunk to every peer. Two hops, but only ~2 x message
//   bytes leave every GPU. The thread that sums lane i of the chunk is the one that pushes
//   it, so no block ever waits for another block of its own kernel.
#include "launch.cuh"

namespace hc {

template <typename T>
__global__ void __launch_bounds__(kThreads)
    all_reduce_one_shot(GroupArgs g, const uint2* __restrict__ in, uint2* __restrict__ out, int64_t lanes) {
  const Call c = begin_call(g);
  const Deadline dl(g);
  arrive(g, c);
  const int n = g.nranks;
  for (int64_t i = grid_thread(); i < lanes; i += grid_threads()) {
    uint2 v = in[i];
    for (int k = 1; k < n; ++k) {
      int peer = (g.me + k) % n;  // staggered so that peers are not all hit at once
      put_packet(area(g, g.regions[peer], c.slot, 0, g.me) + i, v, c.flag);
    }
  }
  for (int64_t i = grid_thread(); i < lanes; i += grid_threads()) {
    out[i] = reduce_sources<T>(g, c, dl, kAllReduce, 0, n, g.me, 0, i, in[i]);
  }
  end_call(g, c, dl, kAllReduce);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    all_reduce_two_shot(GroupArgs g, const uint2* __restrict__ in, uint2* __restrict__ out, int64_t lanes) {
  const Call c = begin_call(g);
  const Deadline dl(g);
  arrive(g, c);
  const int n = g.nranks, me = g.me;
  const int64_t longest = (lanes + n - 1) / n;
  // Phase 1: lane i of chunk j goes to rank j.
  for (int64_t i = grid_thread(); i < longest; i += grid_threads()) {
    for (int k = 1; k < n; ++k) {
      int peer = (me + k) % n;
      int64_t begin = chunk_begin(lanes, peer, n), len = chunk_begin(lanes, peer + 1, n) - begin;
      if (i < len) put_packet(area(g, g.regions[peer], c.slot, 0, me) + i, in[begin + i], c.flag);
    }
  }
  const int64_t mine = chunk_begin(lanes, me, n), my_len = chunk_begin(lanes, me + 1, n) - mine;
  for (int64_t i = grid_thread(); i < longest; i += grid_threads()) {
    if (i < my_len) {
      uint2 r = reduce_sources<T>(g, c, dl, kAllReduce, 0, n, me, 0, i, in[mine + i]);
      out[mine + i] = r;
      for (int k = 1; k < n; ++k) {
        int peer = (me + k) % n;
        put_packet(area(g, g.regions[peer], c.slot, 1, me) + i, r, c.flag);
      }
    }
    // Phase 2: the summed lane i of every other chunk.
    const uint4* src[kMaxRanks];
    uint2 data[kMaxRanks];
    uint32_t pending = 0;
#pragma unroll
    for (int s = 0; s < kMaxRanks; ++s) {
      src[s] = nullptr;
      if (s < n && s != me && i < chunk_begin(lanes, s + 1, n) - chunk_begin(lanes, s, n)) {
        src[s] = area(g, g.regions[me], c.slot, 1, s) + i;
        pending |= 1u << s;
      }
    }
    const uint32_t received = pending;
    get_packets(src, pending, c.flag, data, g, dl, kAllReduce, 0);
#pragma unroll
    for (int s = 0; s < kMaxRanks; ++s) {
      if ((received >> s) & 1u) out[chunk_begin(lanes, s, n) + i] = data[s];
    }
  }
  end_call(g, c, dl, kAllReduce);
}

}  // namespace hc

using namespace hc;

// algorithm: 0 = one-shot, 1 = two-shot. nbytes must be a multiple of 8 (the host checks 16).
extern "C" int hc_all_reduce(const GroupArgs* g, int algorithm, int dtype, const void* in, void* out,
                             int64_t nbytes, cudaStream_t stream) {
  const int64_t lanes = nbytes / 8;
  const int64_t per_peer = algorithm == 0 ? lanes : (lanes + g->nranks - 1) / g->nranks;
  if (nbytes % 8 || per_peer * 16 > (int64_t)g->area_bytes) return (int)cudaErrorInvalidValue;
  const int blocks = blocks_for(per_peer, *g);
  HC_DISPATCH_DTYPE(dtype, {
    if (algorithm == 0)
      all_reduce_one_shot<Elem><<<blocks, kThreads, 0, stream>>>(*g, (const uint2*)in, (uint2*)out, lanes);
    else
      all_reduce_two_shot<Elem><<<blocks, kThreads, 0, stream>>>(*g, (const uint2*)in, (uint2*)out, lanes);
  });
  return launch_status();
}
