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
  const EarlyRows<uint2> input = early_rows(in, io.in_lanes(), rc, n, io.row_lanes);  // (rows.cuh: why)
  arrive(cx, make_fingerprint(kReduceScatterV, Lane<T>::kDType, 0, 0, rc.hash, (uint64_t)io.row_lanes * 8));
  for (int64_t i = grid_thread(); i < rc.max * io.row_lanes; i += grid_threads()) {
    cx.everyone().for_each_other([&](int peer) {  // member peer's rows go to peer
      if (i < rc.count(peer) * io.row_lanes) put_lane(cx, peer, 0, i, input.at(peer, i));
    });
  }
  for (int64_t i = grid_thread(); i < rc.count(me) * io.row_lanes; i += grid_threads()) {
    uint2 local = input.at(me, i);
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
  const Grid grid = spread_grid(grid_rows(io, g->nranks, RowsSpan::kLargest, in_rows) * io.row_lanes, *g);
  HC_DISPATCH_DTYPE(dtype, {
    status = launch_kernel(reduce_scatter_v_push<Elem>, grid.blocks, grid.threads, stream, pdl, *g, (const uint2*)in,
                           (uint2*)out, io);
  });
  return status;
}
