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
  const int n = g.nranks, me = g.me;
  const int64_t row_units = io.row_lanes / 2;
  const RowCounts rc = load_counts_within(cx, io.sizes, n, row_units * kChunkedUnitBytes, kChunkedWireFactor,
                                          g.area_bytes);
  check_buffers(cx, rc.count[me] > io.in_rows || rc.offset[n] > io.out_rows);
  arrive(cx, make_fingerprint(kAllGatherV, Lane<T>::kDType, kChunkedOneShot, variant, rc.hash,
                              (uint64_t)row_units * kChunkedUnitBytes));
  const int64_t in_units = io.in_rows * row_units, out_units = io.out_rows * row_units;
  // Units of chunk c of source s's rows (0 past their end).
  auto piece = [&](int s, int64_t c) {
    const int64_t left = rc.count[s] * row_units - c * chunk;
    return left <= 0 ? (int64_t)0 : left < chunk ? left : chunk;
  };
  // Units of chunk c of source s that fit my output from unit `at` on (its capacity).
  auto fitting = [&](int s, int64_t c, int64_t at) {
    const int64_t room = out_units - at, len = piece(s, c);
    return room <= 0 ? (int64_t)0 : len < room ? len : room;
  };
  const int64_t chunks = (rc.max * row_units + chunk - 1) / chunk;
  const int64_t mine = blockIdx.x < chunks ? (chunks - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  auto nth = [&](int64_t i) { return (int64_t)blockIdx.x + i * gridDim.x; };
  for (int64_t i = 0; i < mine + 1; ++i) {
    if (i < mine) {  // send my i-th chunk to every peer, and to my own output
      const int64_t c = nth(i), first = c * chunk, at = rc.offset[me] * row_units + first;
      auto load = [&](int64_t u) { return load_unit<T>(in, first + u, in_units); };
      cx.everyone().for_each_other(
          [&](int peer) { copy_units(chunked_area(cx, g.regions[peer], 0, me) + first, piece(me, c), load); });
      copy_units(out + at, fitting(me, c, at), load);
      release_chunk(cx, 0, c);
    }
    if (i >= 1) {  // receive my (i-1)-th chunk from every source that has one
      const int64_t c = nth(i - 1), first = c * chunk;
      wait_chunk(cx, 0, c, [&](int s) { return piece(s, c) > 0; });
      cx.everyone().for_each_other([&](int src) {
        const uint4* from = chunked_area(cx, g.regions[me], 0, src) + first;
        const int64_t at = rc.offset[src] * row_units + first;
        copy_units(out + at, fitting(src, c, at), [&](int64_t u) { return __ldcg(from + u); });
      });
    }
  }
  end_call(cx);
}

}  // namespace hc

using namespace hc;

// The arguments of hc_all_gather_v (dtype: fp32 / fp16 / bf16: it decides what the
// reserved-pattern fix touches), then chunk_bytes (chunk_variant) and blocks, then pdl. The
// chunk size follows from the area (the most a source can send), so every rank cuts the same
// chunks whatever its counts; with the default 4 MiB areas it is never raised.
extern "C" int hc_all_gather_v_pipelined(const GroupArgs* g, int dtype, const void* in, void* out,
                                         const int32_t* sizes_device, const int32_t* sizes_host, int64_t row_bytes,
                                         int64_t in_rows, int64_t out_rows, int64_t chunk_bytes, int blocks, int pdl,
                                         cudaStream_t stream) {
  const int variant = chunk_variant(chunk_bytes);
  if (row_bytes % kRowAlignBytes || variant < 0 || blocks < 1) return (int)cudaErrorInvalidValue;
  const RowsArg io = rows_arg(sizes_device, sizes_host, g->nranks, row_bytes, in_rows, out_rows);
  const int64_t area_units = (int64_t)(g->area_bytes / kChunkedUnitBytes), chunk = chunk_units(area_units, chunk_bytes);
  const int64_t most = out_rows * (row_bytes / kChunkedUnitBytes);  // a source's part is at most this
  const int grid = pipeline_blocks(ceil_div(most < area_units ? most : area_units, chunk), blocks, *g);
  HC_DISPATCH_DTYPE(dtype, {
    return launch_kernel(all_gather_v_pipelined<Elem>, grid, kThreads, stream, pdl, *g, (const uint4*)in,
                         (uint4*)out, io, chunk, variant);
  });
  return (int)cudaErrorInvalidValue;
}
