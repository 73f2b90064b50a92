// all_reduce over a group: one-shot for small messages, two-shot above.
//
// one-shot: every rank pushes its whole input to every peer; each rank sums all n inputs.
//   One NVLink hop of latency; (n-1) x message bytes leave every GPU.
// two-shot: rank j owns chunk j. Phase 1 pushes chunk j of the input to rank j, which sums
//   it; phase 2 pushes the summed chunk to every peer. Two hops, but only ~2 x message
//   bytes leave every GPU. The thread that sums lane i of the chunk is the one that pushes
//   it, so no block ever waits for another block of its own kernel.
// two-shot bulk: the same on plain stores and per-block flags (protocol.cuh), for sizes
//   where LL's doubled bytes cost more than the extra flag round trip.
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

// Two-shot on the bulk protocol: the same two phases, 16-byte units, half the bytes of LL.
// Block b owns units [b * per_block, (b + 1) * per_block) of every chunk, in both phases, so
// it only ever waits for the same block of its peers.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    all_reduce_two_shot_bulk(GroupArgs g, const uint4* __restrict__ in, uint4* __restrict__ out, int64_t units) {
  const Call c = begin_call(g);
  const Deadline dl(g);
  arrive(g, c);
  const int n = g.nranks, me = g.me;
  const int64_t longest = (units + n - 1) / n;
  const int64_t per_block = (longest + gridDim.x - 1) / gridDim.x;
  const int64_t lo = blockIdx.x * per_block, hi = min(lo + per_block, longest);
  auto chunk = [&](int j, int64_t& begin, int64_t& len) {
    begin = chunk_begin(units, j, n);
    len = chunk_begin(units, j + 1, n) - begin;
  };
  // Phase 1: my input's chunk j goes to rank j.
  for (int k = 1; k < n; ++k) {
    const int peer = (me + k) % n;
    int64_t begin, len;
    chunk(peer, begin, len);
    uint4* dst = area(g, g.regions[peer], c.slot, 0, me);
    for (int64_t u = lo + threadIdx.x; u < min(hi, len); u += blockDim.x) dst[u] = in[begin + u];
  }
  signal_block(g, c, 0);
  wait_block(g, c, dl, 0, kAllReduce);
  // Sum my chunk in group order, keep it, push it to every peer.
  int64_t mine, my_len;
  chunk(me, mine, my_len);
  for (int64_t u = lo + threadIdx.x; u < min(hi, my_len); u += blockDim.x) {
    uint2 lo_lanes[kMaxRanks], hi_lanes[kMaxRanks];
#pragma unroll
    for (int s = 0; s < kMaxRanks; ++s) {
      if (s < n) {
        const uint4 v = s == me ? in[mine + u] : take_unit(area(g, g.regions[me], c.slot, 0, s) + u);
        lo_lanes[s] = make_uint2(v.x, v.y);
        hi_lanes[s] = make_uint2(v.z, v.w);
      }
    }
    float a[4], b[4];
    sum_lanes<T>(lo_lanes, n, a);
    sum_lanes<T>(hi_lanes, n, b);
    const uint2 ra = Lane<T>::pack(a), rb = Lane<T>::pack(b);
    const uint4 r = make_uint4(ra.x, ra.y, rb.x, rb.y);
    out[mine + u] = r;
    for (int k = 1; k < n; ++k) area(g, g.regions[(me + k) % n], c.slot, 1, me)[u] = r;
  }
  signal_block(g, c, 1);
  wait_block(g, c, dl, 1, kAllReduce);
  // Phase 2: every other chunk, summed by its owner.
  for (int k = 1; k < n; ++k) {
    const int src = (me + k) % n;
    int64_t begin, len;
    chunk(src, begin, len);
    uint4* from = area(g, g.regions[me], c.slot, 1, src);
    for (int64_t u = lo + threadIdx.x; u < min(hi, len); u += blockDim.x) out[begin + u] = take_unit(from + u);
  }
  end_call(g, c, dl, kAllReduce);
}

}  // namespace hc

using namespace hc;

// algorithm: 0 = one-shot, 1 = two-shot (LL), 2 = two-shot (bulk). nbytes: a multiple of 16.
extern "C" int hc_all_reduce(const GroupArgs* g, int algorithm, int dtype, const void* in, void* out,
                             int64_t nbytes, cudaStream_t stream) {
  if (nbytes % 16 || algorithm < 0 || algorithm > 2) return (int)cudaErrorInvalidValue;
  const int64_t lanes = nbytes / 8, units = nbytes / 16;
  // Bytes each source puts in one area: LL doubles the payload, bulk does not.
  const int64_t area_use = algorithm == 0 ? lanes * 16 : algorithm == 1 ? (lanes + g->nranks - 1) / g->nranks * 16
                                                                          : (units + g->nranks - 1) / g->nranks * 16;
  if (area_use > (int64_t)g->area_bytes) return (int)cudaErrorInvalidValue;
  const int blocks = blocks_for(algorithm == 0 ? lanes : area_use / 16, *g);
  HC_DISPATCH_DTYPE(dtype, {
    if (algorithm == 0)
      all_reduce_one_shot<Elem><<<blocks, kThreads, 0, stream>>>(*g, (const uint2*)in, (uint2*)out, lanes);
    else if (algorithm == 1)
      all_reduce_two_shot<Elem><<<blocks, kThreads, 0, stream>>>(*g, (const uint2*)in, (uint2*)out, lanes);
    else
      all_reduce_two_shot_bulk<Elem><<<blocks, kThreads, 0, stream>>>(*g, (const uint4*)in, (uint4*)out, units);
  });
  return launch_status();
}
