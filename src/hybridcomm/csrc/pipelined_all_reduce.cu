// all_reduce for large messages: a two-shot pipelined in chunks on the chunked protocol.
//
// Rank j owns shard j of the message (chunk_begin cuts it as the other two-shots do). Each
// shard is cut into chunks of `chunk` units (16 bytes); chunk c of every shard is handled by
// block c % blocks of every rank, in three steps:
//   send:   my input's chunk c of shard p goes into peer p's area A, then one flag per peer;
//   reduce: once every peer's chunk c of my shard is there, sum it with mine in fp32 in group
//           order (the reference's bits), write it to my output and into every peer's area B;
//   gather: once every peer's reduced chunk c of its shard is there, copy it to my output.
// A block runs them as a software pipeline over its chunks: at step i it sends its i-th
// chunk, reduces its (i-1)-th and gathers its (i-2)-th. So the reduce of one chunk overlaps
// the transfer of the next, all blocks of all ranks keep NVLink busy in both phases, and a
// wait is normally for data sent a step earlier. Every wait is for a chunk of a smaller
// index or an earlier step of the same chunk, so ranks may even run different block counts.
//
// Push, not pull (docs/architecture.md, "The bandwidth path"): the input is read once, where
// it lies, and sent with posted stores; the receiver reads its own memory.
#include "chunked.cuh"
#include "launch.cuh"

namespace hc {

// The message cut into one shard per member, each shard into chunks of `chunk` units.
struct Shards {
  int64_t units, chunk;
  int n;

  __device__ __forceinline__ int64_t begin(int j) const { return chunk_begin(units, j, n); }
  // Units of chunk c of shard j (0 past its end; shards differ by at most one unit).
  __device__ __forceinline__ int64_t piece(int j, int64_t c) const {
    const int64_t left = begin(j + 1) - begin(j) - c * chunk;
    return left <= 0 ? 0 : left < chunk ? left : chunk;
  }
};

template <typename T>
__device__ __forceinline__ void send_chunk(const CallCtx& cx, const Shards& sh, const uint4* __restrict__ in,
                                           int64_t c) {
  const GroupArgs& g = cx.g;
  cx.everyone().for_each_other([&](int peer) {
    const uint4* src = in + sh.begin(peer) + c * sh.chunk;
    copy_units(chunked_area(cx, g.regions[peer], 0, g.me) + c * sh.chunk, sh.piece(peer, c),
               [&](int64_t u) { return fix_reserved<T>(src[u]); });
  });
  release_chunk(cx, 0, c);
}

template <typename T, int kRanks>
__device__ __forceinline__ void reduce_chunk(const CallCtx& cx, const Shards& sh, const uint4* __restrict__ in,
                                             uint4* __restrict__ out, int64_t c) {
  const GroupArgs& g = cx.g;
  const int me = g.me;
  wait_chunk(cx, 0, c);
  const int64_t first = c * sh.chunk, mine = sh.begin(me) + first;
  reduce_units<T, kRanks>(cx, 0, first, sh.piece(me, c), [&](int64_t u) { return fix_reserved<T>(in[mine + u]); },
                          [&](int64_t u, uint4 r) {
                            out[mine + u] = r;
                            cx.everyone().for_each_other(
                                [&](int peer) { chunked_area(cx, g.regions[peer], 1, me)[first + u] = r; });
                          });
  release_chunk(cx, 1, c);
}

__device__ __forceinline__ void gather_chunk(const CallCtx& cx, const Shards& sh, uint4* __restrict__ out,
                                             int64_t c) {
  const GroupArgs& g = cx.g;
  wait_chunk(cx, 1, c);
  cx.everyone().for_each_other([&](int src) {
    const uint4* from = chunked_area(cx, g.regions[g.me], 1, src) + c * sh.chunk;
    copy_units(out + sh.begin(src) + c * sh.chunk, sh.piece(src, c), [&](int64_t u) { return __ldcg(from + u); });
  });
}

template <typename T, int kRanks>
__global__ void __launch_bounds__(kThreads)
    all_reduce_pipelined(GroupArgs g, const uint4* __restrict__ in, uint4* __restrict__ out, int64_t units,
                         int64_t chunk, int variant) {
  const CallCtx cx = begin_call(g, kAllReduce);
  arrive(cx, make_fingerprint(kAllReduce, Lane<T>::kDType, kAllReduceTwoShotPipelined, variant, 0,
                              (uint64_t)units * kChunkedUnitBytes));
  const Shards sh{units, chunk, g.nranks};
  const int64_t longest = (units + g.nranks - 1) / g.nranks;
  const int64_t steps = block_chunks((longest + chunk - 1) / chunk);
  for (int64_t i = 0; i < steps + 2; ++i) {
    if (i < steps) send_chunk<T>(cx, sh, in, nth_chunk(i));
    if (i >= 1 && i <= steps) reduce_chunk<T, kRanks>(cx, sh, in, out, nth_chunk(i - 1));
    if (i >= 2) gather_chunk(cx, sh, out, nth_chunk(i - 2));
  }
  end_call(cx);
}

// One call on `units` units whose shards fit one area.
template <typename T>
int launch_call(const GroupArgs& g, const uint4* in, uint4* out, int64_t units, int64_t chunk_bytes, int variant,
                int blocks, int pdl, cudaStream_t stream) {
  const int64_t longest = ceil_div(units, g.nranks), chunk = chunk_units(longest, chunk_bytes);
  const int grid = pipeline_blocks(ceil_div(longest, chunk), blocks, g);
  auto kernel = g.nranks == 2 ? all_reduce_pipelined<T, 2>
                : g.nranks == 4 ? all_reduce_pipelined<T, 4> : all_reduce_pipelined<T, 0>;
  return launch_kernel(kernel, grid, kThreads, stream, pdl, g, in, out, units, chunk, variant);
}

}  // namespace hc

using namespace hc;

// nbytes: a multiple of kRowAlignBytes. A message whose shards do not fit one area runs as
// consecutive calls on slices of members x area bytes (each with its own flag and slot, like
// any two calls; the same cut on every rank), so any size runs on the default workspace.
// chunk_bytes: see chunk_variant; raised (identically on every rank) where a shard would need
// more than kMaxChunks chunks. blocks: at most one per SM (all must be resident) and one per
// chunk are launched.
extern "C" int hc_all_reduce_pipelined(const GroupArgs* g, int dtype, const void* in, void* out, int64_t nbytes,
                                       int64_t chunk_bytes, int blocks, int pdl, cudaStream_t stream) {
  int status = 0;  // cudaError_t of the launches
  const int variant = chunk_variant(chunk_bytes);
  const int64_t slice = (int64_t)(g->area_bytes / kChunkedUnitBytes) * g->nranks;  // units per call
  if (nbytes % kRowAlignBytes || variant < 0 || blocks < 1 || slice < 1) return (int)cudaErrorInvalidValue;
  const int64_t units = nbytes / kChunkedUnitBytes;
  const auto* x = (const uint4*)in;
  auto* y = (uint4*)out;
  HC_DISPATCH_DTYPE(dtype, {
    int64_t first = 0;
    do {
      const int64_t part = units - first < slice ? units - first : slice;
      status = launch_call<Elem>(*g, x + first, y + first, part, chunk_bytes, variant, blocks, pdl, stream);
      first += part;
    } while (status == 0 && first < units);
  });
  return status;
}
