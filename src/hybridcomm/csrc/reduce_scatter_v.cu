// reduce_scatter_v over a group, uneven rows per member: every rank pushes member j's rows
// of its input to rank j; each rank sums what it received in group order (fp32).
#include "launch.cuh"

namespace hc {

template <typename T>
__global__ void __launch_bounds__(kThreads)
    reduce_scatter_v_push(GroupArgs g, const uint2* __restrict__ in, uint2* __restrict__ out, SizesArg sizes,
                          int64_t row_lanes, int64_t in_rows, int64_t out_rows) {
  const CallCtx cx = begin_call(g, kReduceScatterV);
  const int n = g.nranks, me = g.me;
  const RowCounts rc = load_counts_checked(cx, sizes, n, row_lanes);
  check_buffers(cx, rc.offset[n] > in_rows || rc.count[me] > out_rows);
  const int64_t in_lanes = in_rows * row_lanes, out_lanes = out_rows * row_lanes;
  for (int64_t i = grid_thread(); i < rc.max * row_lanes; i += grid_threads()) {
    cx.everyone().for_each_other([&](int peer) {  // member peer's rows go to peer
      const int64_t src = rc.offset[peer] * row_lanes + i;
      if (i < rc.count[peer] * row_lanes) put_lane(cx, peer, 0, i, src < in_lanes ? in[src] : make_uint2(0, 0));
    });
  }
  const int64_t mine = rc.offset[me] * row_lanes;
  for (int64_t i = grid_thread(); i < rc.count[me] * row_lanes; i += grid_threads()) {
    uint2 local = mine + i < in_lanes ? in[mine + i] : make_uint2(0, 0);
    uint2 r = reduce_sources<T>(cx, 0, n, me, 0, i, local);
    if (i < out_lanes) out[i] = r;
  }
  end_call(cx);
}

}  // namespace hc

using namespace hc;

extern "C" int hc_reduce_scatter_v(const GroupArgs* g, int dtype, const void* in, void* out,
                                   const int32_t* sizes_device, const int32_t* sizes_host, int64_t row_bytes,
                                   int64_t in_rows, int64_t out_rows, cudaStream_t stream) {
  if (row_bytes % kRowAlignBytes) return (int)cudaErrorInvalidValue;
  const SizesArg sizes = sizes_arg(sizes_device, sizes_host, g->nranks);
  const int64_t row_lanes = row_bytes / 8;
  const int blocks = blocks_for(in_rows * row_lanes, *g);
  HC_DISPATCH_DTYPE(dtype, {
    reduce_scatter_v_push<Elem><<<blocks, kThreads, 0, stream>>>(*g, (const uint2*)in, (uint2*)out, sizes,
                                                                 row_lanes, in_rows, out_rows);
  });
  return launch_status();
}
