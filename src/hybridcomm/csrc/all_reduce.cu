// all_reduce over a group: one-shot for small messages, two-shot above.
//
// one-shot: every rank pushes its whole input to every peer; each rank sums all n inputs.
//   One NVLink hop of latency; (n-1) x message bytes leave every GPU.
// two-shot: rank j owns chunk j. Phase 1 pushes chunk j of the input to rank j, which sums
//   it; phase 2 pushes the summed chunk to every peer. Two hops, but only ~2 x message
//   bytes leave every GPU. The thread that sums lane i of the chunk is the one that pushes
//   it, so no block ever waits for another block of its own kernel.
// two-shot bulk: the same on plain stores and per-block flags (bulk.cuh), for sizes
//   where LL's doubled bytes cost more than the extra flag round trip.
#include "launch.cuh"

namespace hc {

// Each thread loads its first K lanes (i0, i0 + stride, ...) before arrive(): those loads then
// overlap the call-flag load arrive() waits for, instead of following it (one memory latency
// less before the first store). Lanes beyond (grids capped at max_blocks) take the plain loops.
template <typename T, int K>
__device__ __forceinline__ void all_reduce_one_shot(const CallCtx& cx, uint64_t fingerprint,
                                                    const uint2* __restrict__ in, uint2* __restrict__ out,
                                                    int64_t lanes) {
  const int64_t i0 = grid_thread(), stride = grid_threads();
  uint2 first[K];
#pragma unroll
  for (int j = 0; j < K; ++j) first[j] = i0 + j * stride < lanes ? in[i0 + j * stride] : make_uint2(0, 0);
  arrive(cx, fingerprint);
#pragma unroll
  for (int j = 0; j < K; ++j) {
    if (i0 + j * stride < lanes) push_to_peers(cx, cx.everyone(), 0, i0 + j * stride, first[j]);
  }
  for (int64_t i = i0 + K * stride; i < lanes; i += stride) push_to_peers(cx, cx.everyone(), 0, i, in[i]);
  HC_TRACE_EVENT(kTraceSent);
#pragma unroll
  for (int j = 0; j < K; ++j) {
    const int64_t i = i0 + j * stride;
    if (i < lanes) out[i] = reduce_sources<T>(cx, 0, cx.g.nranks, cx.g.me, 0, i, first[j]);
  }
  for (int64_t i = i0 + K * stride; i < lanes; i += stride) {
    out[i] = reduce_sources<T>(cx, 0, cx.g.nranks, cx.g.me, 0, i, in[i]);
  }
}

template <typename T>
__device__ __forceinline__ void all_reduce_two_shot(const CallCtx& cx, const uint2* __restrict__ in,
                                                    uint2* __restrict__ out, int64_t lanes) {
  const int n = cx.g.nranks, me = cx.g.me;
  const int64_t longest = (lanes + n - 1) / n;
  auto chunk_len = [&](int j) { return chunk_begin(lanes, j + 1, n) - chunk_begin(lanes, j, n); };
  // Phase 1: lane i of chunk j goes to rank j.
  for (int64_t i = grid_thread(); i < longest; i += grid_threads()) {
    cx.everyone().for_each_other([&](int peer) {
      if (i < chunk_len(peer)) put_lane(cx, peer, 0, i, in[chunk_begin(lanes, peer, n) + i]);
    });
  }
  const int64_t mine = chunk_begin(lanes, me, n), my_len = chunk_begin(lanes, me + 1, n) - mine;
  for (int64_t i = grid_thread(); i < longest; i += grid_threads()) {
    if (i < my_len) {
      uint2 r = reduce_sources<T>(cx, 0, n, me, 0, i, in[mine + i]);
      out[mine + i] = r;
      push_to_peers(cx, cx.everyone(), 1, i, r);
    }
    // Phase 2: the summed lane i of every other chunk.
    uint2 data[kMaxRanks];
    const uint32_t received = wait_sources(cx, 1, n, 0, i, [&](int s) { return s != me && i < chunk_len(s); }, data);
    for_each_received(received, [&](int s) { out[chunk_begin(lanes, s, n) + i] = data[s]; });
  }
}

// Two-shot on the bulk protocol: the same two phases, 16-byte units, half the bytes of LL.
// Block b owns units [b * per_block, (b + 1) * per_block) of every chunk, in both phases, so
// it only ever waits for the same block of its peers.
template <typename T>
__device__ __forceinline__ void all_reduce_two_shot_bulk(const CallCtx& cx, const uint4* __restrict__ in,
                                                         uint4* __restrict__ out, int64_t units) {
  const int n = cx.g.nranks, me = cx.g.me;
  const int64_t longest = (units + n - 1) / n;
  const int64_t per_block = (longest + gridDim.x - 1) / gridDim.x;
  const int64_t lo = blockIdx.x * per_block, hi = min(lo + per_block, longest);
  auto chunk = [&](int j, int64_t& begin, int64_t& len) {
    begin = chunk_begin(units, j, n);
    len = chunk_begin(units, j + 1, n) - begin;
  };
  // Phase 1: my input's chunk j goes to rank j.
  cx.everyone().for_each_other([&](int peer) {
    int64_t begin, len;
    chunk(peer, begin, len);
    uint4* dst = cx.outbox(peer, 0);
    for (int64_t u = lo + threadIdx.x; u < min(hi, len); u += blockDim.x) dst[u] = in[begin + u];
  });
  signal_block(cx, 0);
  wait_block(cx, 0);
  // Sum my chunk in group order, keep it, push it to every peer.
  int64_t mine, my_len;
  chunk(me, mine, my_len);
  for (int64_t u = lo + threadIdx.x; u < min(hi, my_len); u += blockDim.x) {
    uint4 v[kMaxRanks];
#pragma unroll
    for (int s = 0; s < kMaxRanks; ++s) {
      if (s < n) v[s] = s == me ? in[mine + u] : take_unit(cx.inbox(0, s) + u);
    }
    const uint4 r = sum_units<T>(v, n);
    out[mine + u] = r;
    cx.everyone().for_each_other([&](int peer) { cx.outbox(peer, 1)[u] = r; });
  }
  signal_block(cx, 1);
  wait_block(cx, 1);
  // Phase 2: every other chunk, summed by its owner.
  cx.everyone().for_each_other([&](int src) {
    int64_t begin, len;
    chunk(src, begin, len);
    uint4* from = cx.inbox(1, src);
    for (int64_t u = lo + threadIdx.x; u < min(hi, len); u += blockDim.x) out[begin + u] = take_unit(from + u);
  });
}

// K: lanes per thread of the one-shot (kOneShotShapes below); 1 for the others.
template <typename T, int kAlgorithm, int K = 1>
__global__ void __launch_bounds__(kThreads)
    all_reduce(GroupArgs g, const uint4* __restrict__ in, uint4* __restrict__ out, int64_t units) {
  const CallCtx cx = begin_call(g, kAllReduce);
  const uint64_t fingerprint = make_fingerprint(kAllReduce, Lane<T>::kDType, kAlgorithm, 0, 0, (uint64_t)units * 16);
  if constexpr (kAlgorithm == kAllReduceOneShot) {
    all_reduce_one_shot<T, K>(cx, fingerprint, (const uint2*)in, (uint2*)out, units * 2);  // arrives itself
  } else if constexpr (kAlgorithm == kAllReduceTwoShot) {
    arrive(cx, fingerprint);
    all_reduce_two_shot<T>(cx, (const uint2*)in, (uint2*)out, units * 2);
  } else {
    arrive(cx, fingerprint);
    all_reduce_two_shot_bulk<T>(cx, in, out, units);
  }
  end_call(cx);
}

}  // namespace hc

using namespace hc;

namespace {

// Lanes per thread of the LL one-shot, by message size (first row whose max_bytes holds it).
// Kernels exist for 1 and 2 (the dispatch below).
struct OneShotShape {
  int64_t max_bytes;
  int lanes_per_thread;
};
constexpr OneShotShape kOneShotShapes[] = {{INT64_MAX, 1}};

int one_shot_lanes_per_thread(int64_t nbytes) {
  for (const OneShotShape& s : kOneShotShapes)
    if (nbytes <= s.max_bytes) return s.lanes_per_thread;
  return 1;
}

}  // namespace

// algorithm: an AllReduceAlgorithm (abi.h). nbytes: a multiple of kRowAlignBytes.
extern "C" int hc_all_reduce(const GroupArgs* g, int algorithm, int dtype, const void* in, void* out,
                             int64_t nbytes, int pdl, cudaStream_t stream) {
  int status = 0;  // cudaError_t of the launch
  if (nbytes % kRowAlignBytes || algorithm < kAllReduceOneShot || algorithm > kAllReduceTwoShotBulk)
    return (int)cudaErrorInvalidValue;
  const int64_t lanes = nbytes / 8, units = nbytes / 16;
  // What each source sends one peer per phase, in units of its protocol (LL lanes, bulk units).
  const bool bulk = algorithm == kAllReduceTwoShotBulk;
  const int64_t per_peer = algorithm == kAllReduceOneShot ? lanes : bulk ? ceil_div(units, g->nranks)
                                                                         : ceil_div(lanes, g->nranks);
  if (!fits_area(per_peer * (bulk ? kBulkUnitBytes : kLLUnitBytes), bulk ? kBulkWireFactor : kLLWireFactor,
                 g->area_bytes))
    return (int)cudaErrorInvalidValue;
  const int lanes_per_thread = algorithm == kAllReduceOneShot ? one_shot_lanes_per_thread(nbytes) : 1;
  const Grid grid = spread_grid(ceil_div(per_peer, lanes_per_thread), *g);
  const auto* x = (const uint4*)in;
  auto* y = (uint4*)out;
  HC_DISPATCH_DTYPE(dtype, {
    if (algorithm == kAllReduceOneShot && lanes_per_thread == 2)
      status = launch_kernel(all_reduce<Elem, kAllReduceOneShot, 2>, grid.blocks, grid.threads, stream, pdl, *g, x, y,
                             units);
    else if (algorithm == kAllReduceOneShot)
      status = launch_kernel(all_reduce<Elem, kAllReduceOneShot>, grid.blocks, grid.threads, stream, pdl, *g, x, y,
                             units);
    else if (algorithm == kAllReduceTwoShot)
      status = launch_kernel(all_reduce<Elem, kAllReduceTwoShot>, grid.blocks, grid.threads, stream, pdl, *g, x, y,
                             units);
    else
      status = launch_kernel(all_reduce<Elem, kAllReduceTwoShotBulk>, grid.blocks, grid.threads, stream, pdl, *g, x, y,
                             units);
  });
  return status;
}
