// all_gather_v over a group, uneven rows per member: every rank pushes its rows to every
// peer, each rank copies what arrives to its place in the output (members in group order).
// Row counts may live in device memory, so a captured graph replays with new counts.
#include "launch.cuh"

namespace hc {

__global__ void __launch_bounds__(kThreads)
    all_gather_v_push(GroupArgs g, const uint2* __restrict__ in, uint2* __restrict__ out, SizesArg sizes,
                      int64_t row_lanes, int64_t in_rows, int64_t out_rows) {
  const CallCtx cx = begin_call(g, kAllGatherV);
  const int n = g.nranks, me = g.me;
  const RowCounts rc = load_counts_checked(cx, sizes, n, row_lanes);
  check_buffers(cx, rc.count[me] > in_rows || rc.offset[n] > out_rows);
  const int64_t in_lanes = in_rows * row_lanes, out_lanes = out_rows * row_lanes;
  const int64_t my_lanes = rc.count[me] * row_lanes, my_out = rc.offset[me] * row_lanes;
  for (int64_t i = grid_thread(); i < my_lanes; i += grid_threads()) {
    uint2 v = i < in_lanes ? in[i] : make_uint2(0, 0);
    push_to_peers(cx, cx.everyone(), 0, i, v);
    if (my_out + i < out_lanes) out[my_out + i] = v;
  }
  for (int64_t i = grid_thread(); i < rc.max * row_lanes; i += grid_threads()) {
    uint2 data[kMaxRanks];
    const uint32_t received =
        wait_sources(cx, 0, n, 0, i, [&](int s) { return s != me && i < rc.count[s] * row_lanes; }, data);
#pragma unroll
    for (int s = 0; s < kMaxRanks; ++s) {
      int64_t o = rc.offset[s] * row_lanes + i;
      if (((received >> s) & 1u) && o < out_lanes) out[o] = data[s];
    }
  }
  end_call(cx);
}

}  // namespace hc

using namespace hc;

// sizes_device: int32[nranks] on the device, or null to use sizes_host.
// in_rows / out_rows: rows the buffers hold (capacity); row_bytes must be a multiple of kRowAlignBytes.
extern "C" int hc_all_gather_v(const GroupArgs* g, const void* in, void* out, const int32_t* sizes_device,
                               const int32_t* sizes_host, int64_t row_bytes, int64_t in_rows,
                               int64_t out_rows, cudaStream_t stream) {
  if (row_bytes % kRowAlignBytes) return (int)cudaErrorInvalidValue;
  const SizesArg sizes = sizes_arg(sizes_device, sizes_host, g->nranks);
  const int64_t row_lanes = row_bytes / 8;
  const int blocks = blocks_for(out_rows * row_lanes, *g);
  all_gather_v_push<<<blocks, kThreads, 0, stream>>>(*g, (const uint2*)in, (uint2*)out, sizes, row_lanes,
                                                     in_rows, out_rows);
  return launch_status();
}
