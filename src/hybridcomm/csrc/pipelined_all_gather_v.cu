// all_gather_v for large messages: a one-shot pipelined in chunks on the chunked protocol.
//
// Every rank pushes its rows to every peer in chunks of `chunk` units (16 bytes, full-width
// stores), one release flag per chunk and peer; each rank copies the chunks that arrived to
// their place in the output (members in group order). Chunk c of every source is handled by
// block c % blocks of every rank: at step i a block sends its i-th chunk and receives its
// (i-1)-th, so copying out overlaps the transfer (each wait is for a chunk sent a step
// earlier; waits only go to smaller chunk indices, so no deadlock, whatever the block counts).
// Row counts may live in device memory (graph replays with new counts); a source's rows must
// fit one area (else CapacityExceeded, as for the other protocols).
#include "chunked.cuh"
#include "lamport.cuh"  // load_unit
#include "launch.cuh"

namespace hc {

template <typename T>
__global__ void __launch_bounds__(kThreads)
    all_gather_v_pipelined(GroupArgs g, const uint4* __restrict__ in, uint4* __restrict__ out, RowsArg io,
                           int64_t chunk, int variant) {
  const CallCtx cx = begin_call(g, kAllGatherV);
  const int me = g.me;
  const ChunkedRows r = arrive_chunked_rows<T>(cx, kAllGatherV, io, chunk, /*gather=*/true, variant);
  // Units of chunk c of source s that fit my output from unit `at` on (its capacity).
  auto fitting = [&](int s, int64_t c, int64_t at) {
    const int64_t room = r.out_units - at, len = r.piece(s, c);
    return room <= 0 ? (int64_t)0 : len < room ? len : room;
  };
  const int64_t steps = block_chunks(r.chunks);
  for (int64_t i = 0; i < steps + 1; ++i) {
    if (i < steps) {  // send my i-th chunk to every peer, and to my own output
      const int64_t c = nth_chunk(i), first = c * chunk, at = r.rc.offset[me] * r.row_units + first;
      auto load = [&](int64_t u) { return load_unit<T>(in, first + u, r.in_units); };
      cx.everyone().for_each_other(
          [&](int peer) { copy_units(chunked_area(cx, g.regions[peer], 0, me) + first, r.piece(me, c), load); });
      copy_units(out + at, fitting(me, c, at), load);
      release_chunk(cx, 0, c);
    }
    if (i >= 1) {  // receive my (i-1)-th chunk from every source that has one
      const int64_t c = nth_chunk(i - 1), first = c * chunk;
      wait_chunk(cx, 0, c, [&](int s) { return r.piece(s, c) > 0; });
      cx.everyone().for_each_other([&](int src) {
        const uint4* from = chunked_area(cx, g.regions[me], 0, src) + first;
        const int64_t at = r.rc.offset[src] * r.row_units + first;
        copy_units(out + at, fitting(src, c, at), [&](int64_t u) { return __ldcg(from + u); });
      });
    }
  }
  end_call(cx);
}

}  // namespace hc

using namespace hc;

// The arguments of hc_all_gather_v (dtype: fp32 / fp16 / bf16: it decides what the
// reserved-pattern fix touches), then chunk_bytes (chunk_variant) and blocks (rows_launch), pdl.
extern "C" int hc_all_gather_v_pipelined(const GroupArgs* g, int dtype, const void* in, void* out,
                                         const int32_t* sizes_device, const int32_t* sizes_host, int64_t row_bytes,
                                         int64_t in_rows, int64_t out_rows, int64_t chunk_bytes, int blocks, int pdl,
                                         cudaStream_t stream) {
  const int variant = chunk_variant(chunk_bytes);
  if (row_bytes % kRowAlignBytes || variant < 0 || blocks < 1) return (int)cudaErrorInvalidValue;
  const RowsArg io = rows_arg(sizes_device, sizes_host, g->nranks, row_bytes, in_rows, out_rows);
  const RowsLaunch at = rows_launch(*g, out_rows * (row_bytes / kChunkedUnitBytes), chunk_bytes, blocks);
  HC_DISPATCH_DTYPE(dtype, {
    return launch_kernel(all_gather_v_pipelined<Elem>, at.blocks, kThreads, stream, pdl, *g, (const uint4*)in,
                         (uint4*)out, io, at.chunk, variant);
  });
  return (int)cudaErrorInvalidValue;
}
