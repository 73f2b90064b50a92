// gather_tokens / scatter_tokens one-shot on the Lamport protocol (lamport.cuh). The group is
// the world, ranks numbered rank = dp * tp + t; DP group d holds counts[d] rows.
//
// gather (partial rows, tp >= 2): every rank pushes all its rows, 16 bytes of data per store,
//   to every peer; each rank sums each group's tp contributions (tp order, fp32, rounded once)
//   into the group's place of the output. One hop.
// scatter: every rank pushes group d's rows of its input to each of d's tp ranks; each rank
//   sums the world's contributions to its group's rows (world order). One hop.
// Unit i of a group is unit i of its row-major rows, in every area.
#include "lamport.cuh"
#include "launch.cuh"
#include "own_count.cuh"

namespace hc {

// kOwn: own-count mode (own_count.cuh): io.sizes.own is this DP group's count alone.
template <typename T, bool kOwn>
__global__ void __launch_bounds__(kThreads)
    lamport_gather_tokens_one_shot(GroupArgs g, const __grid_constant__ LamportArgs l, int tp,
                                   const uint4* __restrict__ in, uint4* __restrict__ out, RowsArg io) {
  LamportCall lc = begin_lamport_call(g, l, kGatherTokens);
  const int n = g.nranks, me = g.me, dp = n / tp, d = me / tp, t = me % tp;
  const int64_t row_units = io.row_lanes / 2;
  const EarlyInput<uint4> input = early_input(in, io.in_rows * row_units);
  RowCounts rc = lamport_counts(lc, counted<kOwn>(io, d).sizes, dp, row_units);
  if constexpr (kOwn) rc.hash = kOwnCountsHash;
  check_buffers(lc.cx, rc.count(d) > io.in_rows || rc.offset[dp] > io.out_rows);
  arrive(lc.cx, make_fingerprint(kGatherTokens, Lane<T>::kDType, lc.algorithm(), (tp - 1) | 8, rc.hash,
                                 (uint64_t)row_units * 16));
  if constexpr (kOwn) publish_own_count(lc.cx, io, rc, d);
  const int64_t out_units = io.out_rows * row_units;
  const int64_t my_units = rc.count(d) * row_units;
  for (int64_t i = grid_thread(); i < my_units; i += grid_threads()) {
    const uint4 v = fix_reserved<T>(input.at(i));  // load_unit's (zero stays zero)
    lc.cx.everyone().for_each_other([&](int peer) { put_unit(lc.cx, lc.outbox(peer) + i, v); });
  }
  refill_previous_slot(lc);
  if constexpr (kOwn) learn_counts(lc.cx, io, tp, rc);  // every group's count, for the receive side
  const int64_t total = rc.offset[dp] * row_units;
  for (int64_t o = grid_thread(); o < total; o += grid_threads()) {
    const int od = rc.holder(o, dp, row_units);  // the DP group of output unit o
    const int64_t i = o - rc.offset[od] * row_units;
    uint4 data[kMaxRanks];
    receive_group_units(lc, tp, od, d, t, i, [&] { return fix_reserved<T>(input.at(i)); }, data);
    const uint4 r = sum_units<T>(data, tp);
    if (o < out_units) out[o] = r;
  }
  end_lamport_call(lc, rc.max * row_units);  // group d's ranks each wrote rc.count(d) rows to me
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    lamport_scatter_tokens_one_shot(GroupArgs g, const __grid_constant__ LamportArgs l, int tp,
                                    const uint4* __restrict__ in, uint4* __restrict__ out, RowsArg io) {
  LamportCall lc = begin_lamport_call(g, l, kScatterTokens);
  const int n = g.nranks, me = g.me, dp = n / tp, d = me / tp;
  const int64_t row_units = io.row_lanes / 2;
  const RowCounts rc = lamport_counts(lc, io.sizes, dp, row_units);
  check_buffers(lc.cx, rc.offset[dp] > io.in_rows || rc.count(d) > io.out_rows);
  const EarlyRows<uint4> input = early_rows(in, io.in_rows * row_units, rc, dp, row_units);  // (rows.cuh: why)
  arrive(lc.cx, make_fingerprint(kScatterTokens, Lane<T>::kDType, lc.algorithm(), tp - 1, rc.hash,
                                 (uint64_t)row_units * 16));
  const int64_t in_units = io.in_rows * row_units, out_units = io.out_rows * row_units;
  for (int64_t i = grid_thread(); i < rc.max * row_units; i += grid_threads()) {
    lc.cx.everyone().for_each_other([&](int peer) {  // group pd's rows go to each of its ranks
      const int pd = peer / tp;
      if (i < rc.count(pd) * row_units)
        put_unit(lc.cx, lc.outbox(peer) + i, fix_reserved<T>(input.at(pd, i)));  // load_unit's (zero stays zero)
    });
  }
  refill_previous_slot(lc);
  const int64_t my_units = rc.count(d) * row_units;
  reduce_my_rows<T>(lc, in, in_units, rc.offset[d] * row_units, my_units, out, out_units);
  end_lamport_call(lc, my_units);  // every rank wrote my group's rows into my areas
}

}  // namespace hc

using namespace hc;

// One launcher per transition: the arguments of hc_gather_tokens / hc_scatter_tokens for
// one-shot (partial rows only for the gather), plus pdl (pdl.cuh).
extern "C" int hc_lamport_gather_tokens(const GroupArgs* g, const LamportArgs* l, int dtype, int tp, const void* in,
                                        void* out, const int32_t* sizes_device, const int32_t* sizes_host,
                                        const int32_t* own_count, int64_t row_bytes, int64_t in_rows,
                                        int64_t out_rows, int pdl, cudaStream_t stream) {
  // tp >= 2: with one rank per DP group the transition is all_gather_v, which moves the bits
  // unchanged (this kernel would round each row through fp32).
  if (row_bytes % kRowAlignBytes || tp < 2 || g->nranks % tp || (own_count && !sizes_device))
    return (int)cudaErrorInvalidValue;
  const RowsArg io = rows_arg(sizes_device, sizes_host, g->nranks / tp, row_bytes, in_rows, out_rows, own_count);
  const int64_t rows = grid_rows(io, g->nranks / tp, RowsSpan::kAll, out_rows);
  const Grid grid = spread_grid(rows * (row_bytes / kLamportUnitBytes), *g);
  HC_DISPATCH_DTYPE(dtype, {
    return launch_kernel(own_count ? lamport_gather_tokens_one_shot<Elem, true>
                                   : lamport_gather_tokens_one_shot<Elem, false>,
                         grid.blocks, grid.threads, stream, pdl, *g, *l, tp, (const uint4*)in, (uint4*)out, io);
  });
  return (int)cudaErrorInvalidValue;
}

extern "C" int hc_lamport_scatter_tokens(const GroupArgs* g, const LamportArgs* l, int dtype, int tp, const void* in,
                                         void* out, const int32_t* sizes_device, const int32_t* sizes_host,
                                         int64_t row_bytes, int64_t in_rows, int64_t out_rows, int pdl,
                                         cudaStream_t stream) {
  if (row_bytes % kRowAlignBytes || tp < 1 || g->nranks % tp) return (int)cudaErrorInvalidValue;
  const RowsArg io = rows_arg(sizes_device, sizes_host, g->nranks / tp, row_bytes, in_rows, out_rows);
  const int64_t rows = grid_rows(io, g->nranks / tp, RowsSpan::kLargest, in_rows);
  const Grid grid = spread_grid(rows * (row_bytes / kLamportUnitBytes), *g);
  HC_DISPATCH_DTYPE(dtype, {
    return launch_kernel(lamport_scatter_tokens_one_shot<Elem>, grid.blocks, grid.threads, stream, pdl, *g, *l, tp,
                         (const uint4*)in, (uint4*)out, io);
  });
  return (int)cudaErrorInvalidValue;
}
