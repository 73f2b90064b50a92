// all_reduce one-shot on the Lamport protocol (lamport.cuh): every rank pushes its whole
// input, 16 bytes of data per store, into every peer's area of this call's slot; each rank
// sums all n inputs in group order (fp32, rounded once). One NVLink hop, half the bytes of the
// LL one-shot, no flag round trip.
#include "lamport.cuh"
#include "launch.cuh"

namespace hc {

template <typename T>
__global__ void __launch_bounds__(kThreads)
    lamport_all_reduce_one_shot(GroupArgs g, const __grid_constant__ LamportArgs l, const uint4* __restrict__ in,
                                uint4* __restrict__ out, int64_t units) {
  LamportCall lc = begin_lamport_call(g, l, kAllReduce);
  // This thread's first unit is loaded before arrive(), so the load overlaps those of the call
  // flag and the slot counters (arrive needs them) instead of following them.
  const int64_t u0 = grid_thread();
  const uint4 first = u0 < units ? fix_reserved<T>(in[u0]) : make_uint4(0, 0, 0, 0);
  arrive(lc.cx, make_fingerprint(kAllReduce, Lane<T>::kDType, lc.algorithm(), 0, 0, (uint64_t)units * 16));
  const int n = g.nranks, me = g.me;
  for (int64_t u = u0; u < units; u += grid_threads()) {
    const uint4 v = u == u0 ? first : fix_reserved<T>(in[u]);
    lc.cx.everyone().for_each_other([&](int peer) { put_unit(lc.cx, lc.outbox(peer) + u, v); });
  }
  HC_TRACE_EVENT(kTraceSent);
  refill_previous_slot(lc);
  HC_TRACE_EVENT(kTraceRefilled);
  for (int64_t u = u0; u < units; u += grid_threads()) {
    uint4 data[kMaxRanks];
    const uint4 mine = u == u0 ? first : fix_reserved<T>(in[u]);  // the bits my peers receive from me
    receive_units(lc, n, 0, true, me, u, mine, data);
    out[u] = sum_units<T>(data, n);
  }
  end_lamport_call(lc, units);
}

}  // namespace hc

using namespace hc;

// nbytes: a multiple of kRowAlignBytes, at most one Lamport area. pdl: launch with
// programmatic stream serialization (pdl.cuh).
extern "C" int hc_lamport_all_reduce(const GroupArgs* g, const LamportArgs* l, int dtype, const void* in, void* out,
                                     int64_t nbytes, int pdl, cudaStream_t stream) {
  if (nbytes % kRowAlignBytes || !fits_area(nbytes, kLamportWireFactor, l->area_bytes))
    return (int)cudaErrorInvalidValue;
  const int64_t units = nbytes / kLamportUnitBytes;
  const Grid grid = spread_grid(units, *g);
  HC_DISPATCH_DTYPE(dtype, {
    return launch_kernel(lamport_all_reduce_one_shot<Elem>, grid.blocks, grid.threads, stream, pdl, *g, *l,
                         (const uint4*)in, (uint4*)out, units);
  });
  return (int)cudaErrorInvalidValue;
}
