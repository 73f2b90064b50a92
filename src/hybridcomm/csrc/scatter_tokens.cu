// scatter_tokens: MoE output -> attention, in one kernel. The group is the world, ranks
// numbered rank = dp * tp + t. Every rank holds all rows (DP groups back to back), partial
// over the world; DP group d gets its counts[d] rows summed over all ranks (world order),
// identical on its tp ranks.
//
// one_shot : every rank pushes group d's rows to each of d's tp ranks; each rank sums the
//            world's contributions to its group's rows. One hop.
// two_shot : reduce-scatter over the world (rank (d, t) sums chunk t of group d's rows),
//            then all-gather inside the DP group. Two hops, tp times fewer bytes in phase 1.
#include "launch.cuh"

namespace hc {

template <typename T>
__device__ __forceinline__ void scatter_one_shot(const CallCtx& cx, const TokenShape& s, const EarlyRows<uint2>& in,
                                                 uint2* __restrict__ out, const RowsArg& io) {
  const int64_t row_lanes = s.row_lanes, out_lanes = io.out_lanes();
  for (int64_t i = grid_thread(); i < s.rc.max * row_lanes; i += grid_threads()) {
    cx.everyone().for_each_other([&](int peer) {  // group d's rows go to each of d's ranks
      const int d = peer / s.tp;
      if (i < s.rc.count(d) * row_lanes) put_lane(cx, peer, 0, i, in.at(d, i));
    });
  }
  for (int64_t i = grid_thread(); i < s.rc.count(s.d) * row_lanes; i += grid_threads()) {
    const uint2 local = in.at(s.d, i);
    const uint2 r = reduce_sources<T>(cx, 0, cx.g.nranks, cx.g.me, 0, i, local);
    if (i < out_lanes) out[i] = r;
  }
}

template <typename T>
__device__ __forceinline__ void scatter_two_shot(const CallCtx& cx, const TokenShape& s, const EarlyRows<uint2>& in,
                                                 uint2* __restrict__ out, const RowsArg& io) {
  const int64_t row_lanes = s.row_lanes, out_lanes = io.out_lanes();
  // Phase 1: lane i of group d goes to the tp rank of d whose chunk holds it.
  for (int64_t i = grid_thread(); i < s.rc.max * row_lanes; i += grid_threads()) {
    for (int d = 0; d < s.dp; ++d) {
      if (i >= s.rc.count(d) * row_lanes) continue;
      const int holder = chunk_holder(s, d, i);
      if (holder != cx.g.me) put_lane(cx, holder, 0, i, in.at(d, i));
    }
  }
  // Sum my chunk over the world, keep it, push it to my tp peers.
  const int64_t rows = s.rc.count(s.d);
  const int64_t begin = chunk_begin(rows, s.t, s.tp) * row_lanes, end = chunk_begin(rows, s.t + 1, s.tp) * row_lanes;
  for (int64_t i = begin + grid_thread(); i < end; i += grid_threads()) {
    const uint2 local = in.at(s.d, i);
    const uint2 r = reduce_sources<T>(cx, 0, cx.g.nranks, cx.g.me, 0, i, local);
    if (i < out_lanes) out[i] = r;
    push_to_peers(cx, s.tp_group(), 1, i, r);
  }
  // Phase 2: the other chunks of my group from their tp ranks.
  for (int64_t i = grid_thread(); i < rows * row_lanes; i += grid_threads()) {
    const int holder = chunk_holder(s, s.d, i);
    if (holder == cx.g.me) continue;
    const uint2 v = wait_lane(cx, 1, holder, i);
    if (i < out_lanes) out[i] = v;
  }
}

template <typename T, int kAlgorithm>
__global__ void __launch_bounds__(kThreads)
    scatter_tokens(GroupArgs g, int tp, const uint2* __restrict__ in, uint2* __restrict__ out, RowsArg io) {
  const CallCtx cx = begin_call(g, kScatterTokens);
  const TokenShape s = token_shape(cx, tp, io.sizes, io.row_lanes);
  check_buffers(cx, s.rc.offset[s.dp] > io.in_rows || s.rc.count(s.d) > io.out_rows);
  const EarlyRows<uint2> input = early_rows(in, io.in_lanes(), s.rc, s.dp, io.row_lanes);  // (rows.cuh: why)
  arrive(cx, make_fingerprint(kScatterTokens, Lane<T>::kDType, kAlgorithm, s.variant(0), s.rc.hash,
                              (uint64_t)io.row_lanes * 8));
  if constexpr (kAlgorithm == kScatterTokensOneShot) {
    scatter_one_shot<T>(cx, s, input, out, io);
  } else {
    scatter_two_shot<T>(cx, s, input, out, io);
  }
  end_call(cx);
}

}  // namespace hc

using namespace hc;

// algorithm: a ScatterTokensAlgorithm (abi.h). in_rows / out_rows: rows the buffers hold.
extern "C" int hc_scatter_tokens(const GroupArgs* g, int algorithm, int dtype, int tp, const void* in, void* out,
                                 const int32_t* sizes_device, const int32_t* sizes_host, int64_t row_bytes,
                                 int64_t in_rows, int64_t out_rows, int pdl, cudaStream_t stream) {
  int status = 0;  // cudaError_t of the launch
  if (row_bytes % kRowAlignBytes || tp < 1 || g->nranks % tp) return (int)cudaErrorInvalidValue;
  const RowsArg io = rows_arg(sizes_device, sizes_host, g->nranks / tp, row_bytes, in_rows, out_rows);
  const Grid grid = spread_grid(grid_rows(io, g->nranks / tp, RowsSpan::kLargest, in_rows) * io.row_lanes, *g);
  HC_DISPATCH_DTYPE(dtype, {
    if (algorithm == kScatterTokensOneShot)
      status = launch_kernel(scatter_tokens<Elem, kScatterTokensOneShot>, grid.blocks, grid.threads, stream, pdl, *g,
                             tp, (const uint2*)in, (uint2*)out, io);
    else
      status = launch_kernel(scatter_tokens<Elem, kScatterTokensTwoShot>, grid.blocks, grid.threads, stream, pdl, *g,
                             tp, (const uint2*)in, (uint2*)out, io);
  });
  return status;
}
