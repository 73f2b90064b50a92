// reduce_scatter_v for large messages: a one-shot pipelined in chunks on the chunked protocol.
//
// Every rank pushes member j's rows of its input to rank j in chunks of `chunk` units (16 bytes,
// full-width stores), one release flag per chunk; rank j sums each chunk in group order in fp32
// (the reference's bits) once every source's copy is there. Chunk c belongs to block c % blocks
// of every rank: at step i a block sends its i-th chunk of every peer's rows and reduces its
// (i-1)-th chunk of mine, so the reduce overlaps the transfer (waits only go to smaller chunk
// indices: no deadlock, whatever the block counts). Row counts may live in device memory; a
// member's rows must fit one area (else CapacityExceeded, as for the other protocols).
#include "chunked.cuh"
#include "lamport.cuh"  // load_unit
#include "launch.cuh"

namespace hc {

template <typename T, int kRanks>
__global__ void __launch_bounds__(kThreads)
    reduce_scatter_v_pipelined(GroupArgs g, const uint4* __restrict__ in, uint4* __restrict__ out, RowsArg io,
                               int64_t chunk, int variant) {
  const CallCtx cx = begin_call(g, kReduceScatterV);
  const int me = g.me;
  const ChunkedRows r = arrive_chunked_rows<T>(cx, kReduceScatterV, io, chunk, /*gather=*/false, variant);
  const int64_t steps = block_chunks(r.chunks);
  for (int64_t i = 0; i < steps + 1; ++i) {
    if (i < steps) {  // my input's i-th chunk of every peer's rows, to that peer
      const int64_t c = nth_chunk(i), first = c * chunk;
      cx.everyone().for_each_other([&](int peer) {
        const int64_t at = r.rc.offset[peer] * r.row_units + first;
        copy_units(chunked_area(cx, g.regions[peer], 0, me) + first, r.piece(peer, c),
                   [&](int64_t u) { return load_unit<T>(in, at + u, r.in_units); });
      });
      release_chunk(cx, 0, c);
    }
    if (i >= 1) {  // my (i-1)-th chunk, summed over every source
      const int64_t c = nth_chunk(i - 1), first = c * chunk, at = r.rc.offset[me] * r.row_units + first;
      wait_chunk(cx, 0, c);
      reduce_units<T, kRanks>(
          cx, 0, first, r.piece(me, c), [&](int64_t u) { return load_unit<T>(in, at + u, r.in_units); },
          [&](int64_t u, uint4 sum) {
            if (first + u < r.out_units) out[first + u] = sum;
          });
    }
  }
  end_call(cx);
}

}  // namespace hc

using namespace hc;

// The arguments of hc_reduce_scatter_v, then chunk_bytes (chunk_variant) and blocks
// (rows_launch), then pdl.
extern "C" int hc_reduce_scatter_v_pipelined(const GroupArgs* g, int dtype, const void* in, void* out,
                                             const int32_t* sizes_device, const int32_t* sizes_host,
                                             int64_t row_bytes, int64_t in_rows, int64_t out_rows,
                                             int64_t chunk_bytes, int blocks, int pdl, cudaStream_t stream) {
  const int variant = chunk_variant(chunk_bytes);
  if (row_bytes % kRowAlignBytes || variant < 0 || blocks < 1) return (int)cudaErrorInvalidValue;
  const RowsArg io = rows_arg(sizes_device, sizes_host, g->nranks, row_bytes, in_rows, out_rows);
  const RowsLaunch at = rows_launch(*g, in_rows * (row_bytes / kChunkedUnitBytes), chunk_bytes, blocks);
  HC_DISPATCH_DTYPE(dtype, {
    auto kernel = g->nranks == 2 ? reduce_scatter_v_pipelined<Elem, 2>
                  : g->nranks == 4 ? reduce_scatter_v_pipelined<Elem, 4> : reduce_scatter_v_pipelined<Elem, 0>;
    return launch_kernel(kernel, at.blocks, kThreads, stream, pdl, *g, (const uint4*)in, (uint4*)out, io, at.chunk,
                         variant);
  });
  return (int)cudaErrorInvalidValue;
}
