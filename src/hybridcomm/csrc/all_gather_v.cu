// all_gather_v over a group, uneven rows per member: every rank pushes its rows to every
// peer, each rank copies what arrives to its place in the output (members in group order).
// Row counts may live in device memory, so a captured graph replays with new counts.
#include "launch.cuh"

namespace hc {

__global__ void __launch_bounds__(kThreads)
    all_gather_v_push(GroupArgs g, int dtype, const uint2* __restrict__ in, uint2* __restrict__ out, RowsArg io) {
  const CallCtx cx = begin_call(g, kAllGatherV);
  const RowCounts rc = group_counts(cx, io, /*gather=*/true);
  arrive(cx, make_fingerprint(kAllGatherV, dtype, 0, 0, rc.hash, (uint64_t)io.row_lanes * 8));
  const int n = g.nranks, me = g.me;
  const int64_t my_lanes = rc.count[me] * io.row_lanes, my_out = rc.offset[me] * io.row_lanes;
  for (int64_t i = grid_thread(); i < my_lanes; i += grid_threads()) {
    uint2 v = i < io.in_lanes() ? in[i] : make_uint2(0, 0);
    push_to_peers(cx, cx.everyone(), 0, i, v);
    if (my_out + i < io.out_lanes()) out[my_out + i] = v;
  }
  for (int64_t i = grid_thread(); i < rc.max * io.row_lanes; i += grid_threads()) {
    uint2 data[kMaxRanks];
    const uint32_t received =
        wait_sources(cx, 0, n, 0, i, [&](int s) { return s != me && i < rc.count[s] * io.row_lanes; }, data);
#pragma unroll
    for (int s = 0; s < kMaxRanks; ++s) {
      int64_t o = rc.offset[s] * io.row_lanes + i;
      if (((received >> s) & 1u) && o < io.out_lanes()) out[o] = data[s];
    }
  }
  end_call(cx);
}

}  // namespace hc

using namespace hc;

// sizes_device: int32[nranks] on the device, or null to use sizes_host.
// in_rows / out_rows: rows the buffers hold (capacity); row_bytes must be a multiple of kRowAlignBytes.
// dtype: a DType code, or kOtherDType (rows are moved as bytes; the code is only compared across ranks).
extern "C" int hc_all_gather_v(const GroupArgs* g, int dtype, const void* in, void* out, const int32_t* sizes_device,
                               const int32_t* sizes_host, int64_t row_bytes, int64_t in_rows,
                               int64_t out_rows, cudaStream_t stream) {
  if (row_bytes % kRowAlignBytes) return (int)cudaErrorInvalidValue;
  const RowsArg io = rows_arg(sizes_device, sizes_host, g->nranks, row_bytes, in_rows, out_rows);
  all_gather_v_push<<<blocks_for(out_rows * io.row_lanes, *g), kThreads, 0, stream>>>(*g, dtype, (const uint2*)in,
                                                                                     (uint2*)out, io);
  return launch_status();
}
