// reduce_scatter_v on the Lamport protocol (lamport.cuh), uneven rows per member: every rank
// pushes member j's rows of its input, 16 bytes of data per store, to rank j; each rank sums
// what it received in group order (fp32, rounded once).
#include "lamport.cuh"
#include "launch.cuh"

namespace hc {

template <typename T>
__global__ void __launch_bounds__(kThreads)
    lamport_reduce_scatter_v_push(GroupArgs g, const __grid_constant__ LamportArgs l, const uint4* __restrict__ in,
                                  uint4* __restrict__ out, RowsArg io) {
  LamportCall lc = begin_lamport_call(g, l, kReduceScatterV);
  const int n = g.nranks, me = g.me;
  const int64_t row_units = io.row_lanes / 2;
  const RowCounts rc = lamport_counts(lc, io.sizes, n, row_units);
  check_buffers(lc.cx, rc.offset[n] > io.in_rows || rc.count(me) > io.out_rows);
  const EarlyRows<uint4> input = early_rows(in, io.in_rows * row_units, rc, n, row_units);  // (rows.cuh: why)
  arrive(lc.cx, make_fingerprint(kReduceScatterV, Lane<T>::kDType, lc.algorithm(), 0, rc.hash,
                                 (uint64_t)row_units * 16));
  const int64_t in_units = io.in_rows * row_units, out_units = io.out_rows * row_units;
  for (int64_t i = grid_thread(); i < rc.max * row_units; i += grid_threads()) {
    lc.cx.everyone().for_each_other([&](int peer) {  // member peer's rows go to peer
      if (i < rc.count(peer) * row_units)
        put_unit(lc.cx, lc.outbox(peer) + i, fix_reserved<T>(input.at(peer, i)));  // load_unit's (zero stays zero)
    });
  }
  refill_previous_slot(lc);
  const int64_t my_units = rc.count(me) * row_units;
  reduce_my_rows<T>(lc, in, in_units, rc.offset[me] * row_units, my_units, out, out_units);
  end_lamport_call(lc, my_units);  // every peer wrote my rows into my areas
}

}  // namespace hc

using namespace hc;

// The arguments of hc_reduce_scatter_v, plus pdl (pdl.cuh).
extern "C" int hc_lamport_reduce_scatter_v(const GroupArgs* g, const LamportArgs* l, int dtype, const void* in,
                                           void* out, const int32_t* sizes_device, const int32_t* sizes_host,
                                           int64_t row_bytes, int64_t in_rows, int64_t out_rows, int pdl,
                                           cudaStream_t stream) {
  if (row_bytes % kRowAlignBytes) return (int)cudaErrorInvalidValue;
  const RowsArg io = rows_arg(sizes_device, sizes_host, g->nranks, row_bytes, in_rows, out_rows);
  const int64_t rows = grid_rows(io, g->nranks, RowsSpan::kLargest, in_rows);
  const Grid grid = spread_grid(rows * (row_bytes / kLamportUnitBytes), *g);
  HC_DISPATCH_DTYPE(dtype, {
    return launch_kernel(lamport_reduce_scatter_v_push<Elem>, grid.blocks, grid.threads, stream, pdl, *g, *l,
                         (const uint4*)in, (uint4*)out, io);
  });
  return (int)cudaErrorInvalidValue;
}
