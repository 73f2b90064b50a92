// all_gather_v on the Lamport protocol (lamport.cuh), uneven rows per member: every rank
// pushes its rows, 16 bytes of data per store, to every peer; each rank copies what arrives
// to its place in the output (members in group order). Row counts may live in device memory,
// or be this rank's own count alone, exchanged in the call (own_count.cuh).
#include "lamport.cuh"
#include "launch.cuh"
#include "own_count.cuh"

namespace hc {

// kOwn: own-count mode (own_count.cuh): io.sizes.own is this rank's count alone.
template <typename T, bool kOwn>
__global__ void __launch_bounds__(kThreads)
    lamport_all_gather_v_push(GroupArgs g, const __grid_constant__ LamportArgs l, const uint4* __restrict__ in,
                              uint4* __restrict__ out, RowsArg io) {
  LamportCall lc = begin_lamport_call(g, l, kAllGatherV);
  const int n = g.nranks, me = g.me;
  const int64_t row_units = io.row_lanes / 2;
  const EarlyInput<uint4> input = early_input(in, io.in_rows * row_units);
  RowCounts rc = lamport_counts(lc, counted<kOwn>(io, me).sizes, n, row_units);
  if constexpr (kOwn) rc.hash = kOwnCountsHash;
  check_buffers(lc.cx, rc.count(me) > io.in_rows || rc.offset[n] > io.out_rows);
  arrive(lc.cx, make_fingerprint(kAllGatherV, Lane<T>::kDType, lc.algorithm(), 0, rc.hash,
                                 (uint64_t)row_units * 16));
  if constexpr (kOwn) publish_own_count(lc.cx, io, rc, me);
  const int64_t in_units = io.in_rows * row_units, out_units = io.out_rows * row_units;
  const int64_t my_units = rc.count(me) * row_units, my_out = rc.offset[me] * row_units;
  for (int64_t i = grid_thread(); i < my_units; i += grid_threads()) {
    const uint4 v = fix_reserved<T>(input.at(i));  // load_unit's value (zero stays zero)
    lc.cx.everyone().for_each_other([&](int peer) { put_unit(lc.cx, lc.outbox(peer) + i, v); });
    if (!kOwn && my_out + i < out_units) out[my_out + i] = v;  // own-count mode: my offset comes later
  }
  refill_previous_slot(lc);
  if constexpr (kOwn) {
    learn_counts(lc.cx, io, 1, rc);
    for (int64_t i = grid_thread(); i < rc.count(me) * row_units; i += grid_threads()) {
      const int64_t o = rc.offset[me] * row_units + i;
      if (o < out_units) out[o] = load_unit<T>(in, i, in_units);
    }
  }
  for (int64_t i = grid_thread(); i < rc.max * row_units; i += grid_threads()) {
    uint4 data[kMaxRanks];
    const uint32_t received =
        wait_units(lc, n, 0, i, [&](int s) { return s != me && i < rc.count(s) * row_units; }, data);
    for_each_received(received, [&](int s) {
      const int64_t o = rc.offset[s] * row_units + i;
      if (o < out_units) out[o] = data[s];
    });
  }
  end_lamport_call(lc, rc.max * row_units);  // peers wrote at most rc.max rows into each of my areas
}

}  // namespace hc

using namespace hc;

// The arguments of hc_all_gather_v (dtype: fp32 / fp16 / bf16 only: it decides what the
// reserved-pattern fix touches, and other types may hold the sentinel), plus pdl (pdl.cuh).
extern "C" int hc_lamport_all_gather_v(const GroupArgs* g, const LamportArgs* l, int dtype, const void* in,
                                       void* out, const int32_t* sizes_device, const int32_t* sizes_host,
                                       const int32_t* own_count, int64_t row_bytes, int64_t in_rows,
                                       int64_t out_rows, int pdl, cudaStream_t stream) {
  if (row_bytes % kRowAlignBytes || (own_count && !sizes_device)) return (int)cudaErrorInvalidValue;
  const RowsArg io = rows_arg(sizes_device, sizes_host, g->nranks, row_bytes, in_rows, out_rows, own_count);
  const int64_t rows = grid_rows(io, g->nranks, RowsSpan::kLargest, out_rows);
  const Grid grid = spread_grid(rows * (row_bytes / kLamportUnitBytes), *g);
  HC_DISPATCH_DTYPE(dtype, {
    return launch_kernel(own_count ? lamport_all_gather_v_push<Elem, true> : lamport_all_gather_v_push<Elem, false>,
                         grid.blocks, grid.threads, stream, pdl, *g, *l, (const uint4*)in, (uint4*)out, io);
  });
  return (int)cudaErrorInvalidValue;
}
