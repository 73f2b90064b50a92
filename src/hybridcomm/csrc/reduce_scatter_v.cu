// reduce_scatter_v over a group, uneven rows per member: every rank pushes member j's rows
// of its input to rank j; each rank sums what it received in group order (fp32).
#include "launch.cuh"

namespace hc {

template <typename T>
__global__ void __launch_bounds__(kThreads)
    reduce_scatter_v_push(GroupArgs g, const uint2* __restrict__ in, uint2* __restrict__ out, RowsArg io) {
  const CallCtx cx = begin_call(g, kReduceScatterV);
  const RowCounts rc = group_counts(cx, io, /*gather=*/false);
  const int n = g.nranks, me = g.me;
  const int64_t i0 = grid_thread();
  auto lane = [&](int s, int64_t i) {  // lane i of member s's rows in my input
    const int64_t src = rc.offset[s] * io.row_lanes + i;
    return src < io.in_lanes() ? in[src] : make_uint2(0, 0);
  };
  // Lane i0 of every member's rows, loaded before arrive() and before anything uses the call
  // flag: with host counts these loads overlap the flag's instead of following the arrival
  // packet (as all_reduce's one-shot does). Unrolled: registers, read by selection below.
  uint2 first[kMaxRanks];
#pragma unroll
  for (int s = 0; s < kMaxRanks; ++s) first[s] = s < n ? lane(s, i0) : make_uint2(0, 0);
  auto lane_of = [&](int s, int64_t i) {
    if (i != i0) return lane(s, i);
    uint2 v = first[0];
#pragma unroll
    for (int k = 1; k < kMaxRanks; ++k) v = k == s ? first[k] : v;
    return v;
  };
  arrive(cx, make_fingerprint(kReduceScatterV, Lane<T>::kDType, 0, 0, rc.hash, (uint64_t)io.row_lanes * 8));
  for (int64_t i = i0; i < rc.max * io.row_lanes; i += grid_threads()) {
    cx.everyone().for_each_other([&](int peer) {  // member peer's rows go to peer
      if (i < rc.count(peer) * io.row_lanes) put_lane(cx, peer, 0, i, lane_of(peer, i));
    });
  }
  for (int64_t i = i0; i < rc.count(me) * io.row_lanes; i += grid_threads()) {
    uint2 local = lane_of(me, i);
    uint2 r = reduce_sources<T>(cx, 0, n, me, 0, i, local);
    if (i < io.out_lanes()) out[i] = r;
  }
  end_call(cx);
}

}  // namespace hc

using namespace hc;

extern "C" int hc_reduce_scatter_v(const GroupArgs* g, int dtype, const void* in, void* out,
                                   const int32_t* sizes_device, const int32_t* sizes_host, int64_t row_bytes,
                                   int64_t in_rows, int64_t out_rows, int pdl, cudaStream_t stream) {
  int status = 0;  // cudaError_t of the launch
  if (row_bytes % kRowAlignBytes) return (int)cudaErrorInvalidValue;
  const RowsArg io = rows_arg(sizes_device, sizes_host, g->nranks, row_bytes, in_rows, out_rows);
  const int blocks = blocks_for(grid_rows(io, g->nranks, RowsSpan::kLargest, in_rows) * io.row_lanes, *g);
  HC_DISPATCH_DTYPE(dtype, {
    status = launch_kernel(reduce_scatter_v_push<Elem>, blocks, kThreads, stream, pdl, *g, (const uint2*)in,
                           (uint2*)out, io);
  });
  return status;
}
