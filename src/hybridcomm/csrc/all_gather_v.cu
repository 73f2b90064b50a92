// all_gather_v over a group, uneven rows per member: every rank pushes its rows to every
// peer, each rank copies what arrives to its place in the output (members in group order).
// Row counts may live in device memory, so a captured graph replays with new counts, or be
// this rank's own count alone, exchanged in the call (own_count.cuh).
#include "launch.cuh"
#include "own_count.cuh"
#include "reserved.cuh"

namespace hc {

// kOwn: own-count mode (own_count.cuh): io.sizes.own is this rank's count alone.
template <bool kOwn>
__global__ void __launch_bounds__(kThreads)
    all_gather_v_push(GroupArgs g, int dtype, const uint2* __restrict__ in, uint2* __restrict__ out, RowsArg io) {
  const CallCtx cx = begin_call(g, kAllGatherV);
  const EarlyInput<uint2> input = early_input(in, io.in_lanes());
  const int n = g.nranks, me = g.me;
  RowCounts rc = group_counts(cx, counted<kOwn>(io, me), /*gather=*/true);
  if constexpr (kOwn) rc.hash = kOwnCountsHash;
  arrive(cx, make_fingerprint(kAllGatherV, dtype, 0, 0, rc.hash, (uint64_t)io.row_lanes * 8));
  if constexpr (kOwn) publish_own_count(cx, io, rc, me);
  const int64_t my_lanes = rc.count(me) * io.row_lanes, my_out = rc.offset[me] * io.row_lanes;
  for (int64_t i = grid_thread(); i < my_lanes; i += grid_threads()) {
    const uint2 v = fix_reserved_lane(input.at(i), dtype);  // (zero stays zero)
    push_to_peers(cx, cx.everyone(), 0, i, v);
    if (!kOwn && my_out + i < io.out_lanes()) out[my_out + i] = v;  // own-count mode: my offset comes later
  }
  if constexpr (kOwn) {
    learn_counts(cx, io, 1, rc);
    for (int64_t i = grid_thread(); i < rc.count(me) * io.row_lanes; i += grid_threads()) {
      const int64_t o = rc.offset[me] * io.row_lanes + i;
      if (o < io.out_lanes()) out[o] = i < io.in_lanes() ? fix_reserved_lane(in[i], dtype) : make_uint2(0, 0);
    }
  }
  for (int64_t i = grid_thread(); i < rc.max * io.row_lanes; i += grid_threads()) {
    uint2 data[kMaxRanks];
    const uint32_t received =
        wait_sources(cx, 0, n, 0, i, [&](int s) { return s != me && i < rc.count(s) * io.row_lanes; }, data);
    for_each_received(received, [&](int s) {
      const int64_t o = rc.offset[s] * io.row_lanes + i;
      if (o < io.out_lanes()) out[o] = data[s];
    });
  }
  end_call(cx);
}

}  // namespace hc

using namespace hc;

// sizes_device: int32[nranks] on the device, or null to use sizes_host.
// in_rows / out_rows: rows the buffers hold (capacity); row_bytes must be a multiple of kRowAlignBytes.
// dtype: a DType code, or kOtherDType (rows are moved as bytes; the code is only compared across ranks).
// own_count: int32[1] on the device, this rank's count alone, or null; given, the kernel
// exchanges it and writes every member's count to sizes_device (own_count.cuh).
extern "C" int hc_all_gather_v(const GroupArgs* g, int dtype, const void* in, void* out, const int32_t* sizes_device,
                               const int32_t* sizes_host, const int32_t* own_count, int64_t row_bytes,
                               int64_t in_rows, int64_t out_rows, int pdl, cudaStream_t stream) {
  int status = 0;  // cudaError_t of the launch
  if (row_bytes % kRowAlignBytes || (own_count && !sizes_device)) return (int)cudaErrorInvalidValue;
  const RowsArg io = rows_arg(sizes_device, sizes_host, g->nranks, row_bytes, in_rows, out_rows, own_count);
  const int64_t rows = grid_rows(io, g->nranks, RowsSpan::kLargest, out_rows);
  const Grid grid = spread_grid(rows * io.row_lanes, *g);
  status = launch_kernel(own_count ? all_gather_v_push<true> : all_gather_v_push<false>, grid.blocks, grid.threads,
                         stream, pdl, *g, dtype, (const uint2*)in, (uint2*)out, io);
  return status;
}
