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

struct ScatterShape {
  int tp, dp, d, t;
  RowCounts rc;
};

__device__ __forceinline__ ScatterShape scatter_shape(const GroupArgs& g, int tp, const SizesArg& sizes,
                                                      int64_t row_lanes, int64_t in_rows, int64_t out_rows) {
  const ScatterShape s{tp, g.nranks / tp, g.me / tp, g.me % tp,
                       load_counts_checked(g, sizes, g.nranks / tp, row_lanes, kScatterTokens)};
  check_buffers(g, s.rc.offset[s.dp] > in_rows || s.rc.count[s.d] > out_rows, kScatterTokens);
  return s;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    scatter_tokens_one_shot(GroupArgs g, int tp, const uint2* __restrict__ in, uint2* __restrict__ out,
                            SizesArg sizes, int64_t row_lanes, int64_t in_rows, int64_t out_rows) {
  const Call c = begin_call(g);
  const Deadline dl(g);
  arrive(g, c);
  const ScatterShape s = scatter_shape(g, tp, sizes, row_lanes, in_rows, out_rows);
  const int64_t in_lanes = in_rows * row_lanes, out_lanes = out_rows * row_lanes;
  for (int64_t i = grid_thread(); i < s.rc.max * row_lanes; i += grid_threads()) {
    for (int k = 1; k < g.nranks; ++k) {
      const int peer = (g.me + k) % g.nranks, d = peer / tp;
      const int64_t src = s.rc.offset[d] * row_lanes + i;
      if (i < s.rc.count[d] * row_lanes)
        put_packet(area(g, g.regions[peer], c.slot, 0, g.me) + i, src < in_lanes ? in[src] : make_uint2(0, 0),
                   c.flag);
    }
  }
  const int64_t mine = s.rc.offset[s.d] * row_lanes;
  for (int64_t i = grid_thread(); i < s.rc.count[s.d] * row_lanes; i += grid_threads()) {
    const uint2 local = mine + i < in_lanes ? in[mine + i] : make_uint2(0, 0);
    const uint2 r = reduce_sources<T>(g, c, dl, kScatterTokens, 0, g.nranks, g.me, 0, i, local);
    if (i < out_lanes) out[i] = r;
  }
  end_call(g, c, dl, kScatterTokens);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    scatter_tokens_two_shot(GroupArgs g, int tp, const uint2* __restrict__ in, uint2* __restrict__ out,
                            SizesArg sizes, int64_t row_lanes, int64_t in_rows, int64_t out_rows) {
  const Call c = begin_call(g);
  const Deadline dl(g);
  arrive(g, c);
  const ScatterShape s = scatter_shape(g, tp, sizes, row_lanes, in_rows, out_rows);
  const int64_t in_lanes = in_rows * row_lanes, out_lanes = out_rows * row_lanes;
  // Phase 1: lane i of group d goes to the tp rank of d whose chunk holds it.
  for (int64_t i = grid_thread(); i < s.rc.max * row_lanes; i += grid_threads()) {
    for (int d = 0; d < s.dp; ++d) {
      if (i >= s.rc.count[d] * row_lanes) continue;
      const int holder = d * tp + chunk_owner(i / row_lanes, s.rc.count[d], tp);
      const int64_t src = s.rc.offset[d] * row_lanes + i;
      if (holder != g.me)
        put_packet(area(g, g.regions[holder], c.slot, 0, g.me) + i, src < in_lanes ? in[src] : make_uint2(0, 0),
                   c.flag);
    }
  }
  // Sum my chunk over the world, keep it, push it to my tp peers.
  const int64_t rows = s.rc.count[s.d], mine = s.rc.offset[s.d] * row_lanes;
  const int64_t begin = chunk_begin(rows, s.t, tp) * row_lanes, end = chunk_begin(rows, s.t + 1, tp) * row_lanes;
  for (int64_t i = begin + grid_thread(); i < end; i += grid_threads()) {
    const uint2 local = mine + i < in_lanes ? in[mine + i] : make_uint2(0, 0);
    const uint2 r = reduce_sources<T>(g, c, dl, kScatterTokens, 0, g.nranks, g.me, 0, i, local);
    if (i < out_lanes) out[i] = r;
    for (int k = 1; k < tp; ++k) {
      const int peer = s.d * tp + (s.t + k) % tp;
      put_packet(area(g, g.regions[peer], c.slot, 1, g.me) + i, r, c.flag);
    }
  }
  // Phase 2: the other chunks of my group from their tp ranks.
  for (int64_t i = grid_thread(); i < rows * row_lanes; i += grid_threads()) {
    const int holder = s.d * tp + chunk_owner(i / row_lanes, rows, tp);
    if (holder == g.me) continue;
    const uint2 v = get_packet(area(g, g.regions[g.me], c.slot, 1, holder) + i, c.flag, g, dl, kScatterTokens, holder);
    if (i < out_lanes) out[i] = v;
  }
  end_call(g, c, dl, kScatterTokens);
}

}  // namespace hc

using namespace hc;

// algorithm: 0 = one-shot, 1 = two-shot. in_rows / out_rows: rows the buffers hold.
extern "C" int hc_scatter_tokens(const GroupArgs* g, int algorithm, int dtype, int tp, const void* in, void* out,
                                 const int32_t* sizes_device, const int32_t* sizes_host, int64_t row_bytes,
                                 int64_t in_rows, int64_t out_rows, cudaStream_t stream) {
  if (row_bytes % 16 || tp < 1 || g->nranks % tp) return (int)cudaErrorInvalidValue;
  SizesArg sizes{sizes_device, {}};
  for (int i = 0; i < g->nranks / tp && !sizes_device; ++i) sizes.host[i] = sizes_host[i];
  const int64_t row_lanes = row_bytes / 8;
  const int blocks = blocks_for(in_rows * row_lanes, *g);
  HC_DISPATCH_DTYPE(dtype, {
    if (algorithm == 0)
      scatter_tokens_one_shot<Elem><<<blocks, kThreads, 0, stream>>>(*g, tp, (const uint2*)in, (uint2*)out, sizes,
                                                                     row_lanes, in_rows, out_rows);
    else
      scatter_tokens_two_shot<Elem><<<blocks, kThreads, 0, stream>>>(*g, tp, (const uint2*)in, (uint2*)out, sizes,
                                                                     row_lanes, in_rows, out_rows);
  });
  return launch_status();
}
