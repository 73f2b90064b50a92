// gather_tokens: attention output -> MoE input, in one kernel. The group is the world,
// ranks numbered rank = dp * tp + t. DP group d holds counts[d] rows; on input they are
// partial over its tp ranks (or replicated, partial = 0); on output every rank holds every
// group's rows, summed, in DP order.
//
// one_shot : every rank pushes all its rows to every peer; each rank sums each group's tp
//            contributions. One hop; (world - 1) x rows leave every GPU.
// two_shot : reduce-scatter inside the DP group (rank t sums chunk t of the rows), then
//            the summed chunk goes to every rank. Two hops, fewer bytes.
// fused    : residual add + RMSNorm. Phase 1 sums all of the group's rows on every tp rank
//            (one-shot inside the group), adds the residual and normalises one row per
//            block; every tp rank gets identical bits, so each pushes only its chunk of
//            normed rows to the other groups in phase 2.
//
// Lanes are 8 bytes; lane i of a group is lane i of its row-major rows. Receive areas are
// indexed by that group-local lane in every phase.
//
// Given only this DP group's own count (own_count.cuh), each algorithm learns the others'
// counts after its first sends, which need only its own group's rows (learn_counts).
#include "block_reduce.cuh"
#include "launch.cuh"
#include "own_count.cuh"
#include "reserved.cuh"

namespace hc {

// Lane i to every rank outside my DP group (and to my tp peers too when `with_tp_peers`),
// into their area `phase` under my index.
__device__ __forceinline__ void push_lanes(const CallCtx& cx, const TokenShape& s, int phase, bool with_tp_peers,
                                           int64_t i, uint2 v) {
  cx.everyone().for_each_other([&](int peer) {
    if (with_tp_peers || peer / s.tp != s.d) put_lane(cx, peer, phase, i, v);
  });
}

// Every lane of other groups that arrives chunked (one holder per row) in area `phase`.
// One output lane per thread: measured faster than polling every group's holder at once
// (more threads in flight beat more loads per thread at decode sizes).
__device__ __forceinline__ void receive_chunked(const CallCtx& cx, const TokenShape& s, int phase, bool skip_mine,
                                                uint2* __restrict__ out, int64_t out_lanes) {
  const int64_t total = s.rc.offset[s.dp] * s.row_lanes;
  for (int64_t o = grid_thread(); o < total; o += grid_threads()) {
    const int d = group_of_lane(s, o);
    if (skip_mine && d == s.d) continue;
    const int64_t i = o - s.rc.offset[d] * s.row_lanes;
    const int holder = chunk_holder(s, d, i);
    if (holder == cx.g.me) continue;
    uint2 v = wait_lane(cx, phase, holder, i);
    if (o < out_lanes) out[o] = v;
  }
}

template <typename T, bool kOwn>
__device__ __forceinline__ void gather_one_shot(const CallCtx& cx, TokenShape& s, int partial,
                                                const EarlyInput<uint2>& in, uint2* __restrict__ out,
                                                const RowsArg& io) {
  const int tp = s.tp;
  const int64_t row_lanes = s.row_lanes, out_lanes = io.out_lanes();
  const int64_t my_lanes = s.rc.count(s.d) * row_lanes;
  // Partial rows go to everyone; replicated rows only as my chunk, and only outside my group.
  const int64_t send_begin = partial ? 0 : chunk_begin(s.rc.count(s.d), s.t, tp) * row_lanes;
  const int64_t send_end = partial ? my_lanes : chunk_begin(s.rc.count(s.d), s.t + 1, tp) * row_lanes;
  for (int64_t i = send_begin + grid_thread(); i < send_end; i += grid_threads()) {
    // Replicated rows move unchanged, so the reserved pattern is fixed here (reserved.cuh).
    push_lanes(cx, s, 0, partial, i, fix_reserved<T>(in.at(i)));  // (zero stays zero)
  }
  if constexpr (kOwn) learn_counts(cx, io, tp, s.rc);
  if (partial) {
    const int64_t total = s.rc.offset[s.dp] * row_lanes;
    for (int64_t o = grid_thread(); o < total; o += grid_threads()) {
      const int d = group_of_lane(s, o);
      const int64_t i = o - s.rc.offset[d] * row_lanes;
      const uint2 local = d == s.d ? in.at(i) : make_uint2(0, 0);
      uint2 r = reduce_sources<T>(cx, 0, tp, d == s.d ? s.t : -1, d * tp, i, local);
      if (o < out_lanes) out[o] = r;
    }
  } else {
    const int64_t mine = s.rc.offset[s.d] * row_lanes;
    for (int64_t i = grid_thread(); i < s.rc.count(s.d) * row_lanes; i += grid_threads()) {
      if (mine + i < out_lanes) out[mine + i] = fix_reserved<T>(in.at(i));
    }
    receive_chunked(cx, s, 0, true, out, out_lanes);
  }
}

template <typename T, bool kOwn>
__device__ __forceinline__ void gather_two_shot(const CallCtx& cx, TokenShape& s, const EarlyInput<uint2>& in,
                                                uint2* __restrict__ out, const RowsArg& io) {
  const int tp = s.tp;
  const int64_t row_lanes = s.row_lanes, out_lanes = io.out_lanes();
  // Phase 1: lane i of chunk t' goes to tp peer t'.
  for (int64_t i = grid_thread(); i < s.rc.count(s.d) * row_lanes; i += grid_threads()) {
    const int holder = chunk_holder(s, s.d, i);
    if (holder != cx.g.me) put_lane(cx, holder, 0, i, in.at(i));
  }
  if constexpr (kOwn) learn_counts(cx, io, tp, s.rc);  // (after an error my rows count as zero too)
  const int64_t rows = s.rc.count(s.d);
  // Sum my chunk over the tp ranks, keep it, push it to every other rank.
  const int64_t begin = chunk_begin(rows, s.t, tp) * row_lanes, end = chunk_begin(rows, s.t + 1, tp) * row_lanes;
  const int64_t mine = s.rc.offset[s.d] * row_lanes;
  for (int64_t i = begin + grid_thread(); i < end; i += grid_threads()) {
    const uint2 local = in.at(i);
    uint2 r = reduce_sources<T>(cx, 0, tp, s.t, s.d * tp, i, local);
    if (mine + i < out_lanes) out[mine + i] = r;
    push_lanes(cx, s, 1, true, i, r);
  }
  // Phase 2: every chunk summed elsewhere.
  receive_chunked(cx, s, 1, false, out, out_lanes);
}

template <typename T, bool kOwn>
__device__ __forceinline__ void gather_fused(const CallCtx& cx, TokenShape& s, int partial,
                                             const EarlyInput<uint2>& in, uint2* __restrict__ out,
                                             const uint2* __restrict__ residual, const uint2* __restrict__ weight,
                                             uint2* __restrict__ residual_out, float eps, const RowsArg& io) {
  const int tp = s.tp;
  const int64_t row_lanes = s.row_lanes, out_lanes = io.out_lanes();
  // Phase 1: partial rows to my tp peers.
  if (partial) {
    for (int64_t i = grid_thread(); i < s.rc.count(s.d) * row_lanes; i += grid_threads()) {
      push_to_peers(cx, s.tp_group(), 0, i, in.at(i));
    }
  }
  if constexpr (kOwn) learn_counts(cx, io, tp, s.rc);  // (after an error my rows count as zero too)
  const int64_t rows = s.rc.count(s.d);
  // One block per row (a warp per row serialised 32 packet waits per lane): sum, add the
  // residual, normalise; push the rows of my chunk to the other groups.
  __shared__ float warp_sums[kThreads / 32];
  const float inv_hidden = 1.0f / (float)(row_lanes * Lane<T>::kN);
  const int64_t mine = s.rc.offset[s.d] * row_lanes;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const bool in_bounds = r < io.in_rows;
    float sumsq = 0.f;
    for (int64_t l = threadIdx.x; l < row_lanes; l += blockDim.x) {
      const int64_t i = r * row_lanes + l;
      const uint2 local = in.at(i);  // (zero beyond in_rows, as in_bounds says)
      // fp32 sum in tp order; the residual is added before the single rounding (norm.py).
      float acc[4], res[4];
      sum_sources<T>(cx, 0, partial ? tp : 1, partial ? s.t : 0, s.d * tp, i, local, acc);
      Lane<T>::unpack(in_bounds ? residual[i] : make_uint2(0, 0), res);
#pragma unroll
      for (int k = 0; k < Lane<T>::kN; ++k) acc[k] += res[k];
      const uint2 packed = Lane<T>::pack(acc);
      if (in_bounds) residual_out[i] = packed;
      Lane<T>::unpack(packed, acc);  // the norm sees the rounded residual
#pragma unroll
      for (int k = 0; k < Lane<T>::kN; ++k) sumsq += acc[k] * acc[k];
    }
    const float scale = 1.0f / sqrtf(block_sum(sumsq, warp_sums) * inv_hidden + eps);
    cx.block_aborted();  // the scale sums every thread's lanes: none is sent if one of them never came
    const bool my_chunk = chunk_owner(r, rows, tp) == s.t;
    for (int64_t l = threadIdx.x; l < row_lanes; l += blockDim.x) {
      const int64_t i = r * row_lanes + l;
      float v[4], w[4];
      Lane<T>::unpack(in_bounds ? residual_out[i] : make_uint2(0, 0), v);  // this thread's own store
      Lane<T>::unpack(weight[l], w);
#pragma unroll
      for (int k = 0; k < Lane<T>::kN; ++k) v[k] = v[k] * scale * w[k];
      const uint2 normed = Lane<T>::pack(v);
      if (mine + i < out_lanes) out[mine + i] = normed;
      if (my_chunk) push_lanes(cx, s, 1, false, i, normed);
    }
  }
  // Phase 2: other groups' normed rows, each from the tp rank whose chunk holds it.
  receive_chunked(cx, s, 1, true, out, out_lanes);
}

// kOwn: own-count mode (own_count.cuh): io.sizes.own is this DP group's count alone.
template <typename T, int kAlgorithm, bool kOwn>
__global__ void __launch_bounds__(kThreads)
    gather_tokens(GroupArgs g, int tp, int partial, const uint2* __restrict__ in, uint2* __restrict__ out,
                  const uint2* __restrict__ residual, const uint2* __restrict__ weight,
                  uint2* __restrict__ residual_out, float eps, RowsArg io) {
  const CallCtx cx = begin_call(g, kGatherTokens);
  const EarlyInput<uint2> input = early_input(in, io.in_lanes());
  TokenShape s = token_shape(cx, tp, counted<kOwn>(io, g.me / tp).sizes, io.row_lanes);
  if constexpr (kOwn) s.rc.hash = kOwnCountsHash;
  check_buffers(cx, s.rc.count(s.d) > io.in_rows || s.rc.offset[s.dp] > io.out_rows);
  arrive(cx, make_fingerprint(kGatherTokens, Lane<T>::kDType, kAlgorithm, s.variant(partial), s.rc.hash,
                              (uint64_t)io.row_lanes * 8));
  if constexpr (kOwn) publish_own_count(cx, io, s.rc, s.d);
  if constexpr (kAlgorithm == kGatherTokensOneShot) {
    gather_one_shot<T, kOwn>(cx, s, partial, input, out, io);
  } else if constexpr (kAlgorithm == kGatherTokensTwoShot) {
    gather_two_shot<T, kOwn>(cx, s, input, out, io);
  } else {
    gather_fused<T, kOwn>(cx, s, partial, input, out, residual, weight, residual_out, eps, io);
  }
  end_call(cx);
}

// One algorithm's kernel, its own-count instance or not.
template <typename T, int kAlgorithm, typename... Args>
int launch_gather_tokens(bool own, Grid grid, cudaStream_t stream, int pdl, Args... args) {
  return launch_kernel(own ? gather_tokens<T, kAlgorithm, true> : gather_tokens<T, kAlgorithm, false>, grid.blocks,
                       grid.threads, stream, pdl, args...);
}

}  // namespace hc

using namespace hc;

// algorithm: a GatherTokensAlgorithm (abi.h); two-shot takes partial rows only; fused adds the
// residual and applies RMSNorm.
// own_count: this DP group's count alone (as in hc_all_gather_v; sizes_device receives every group's).
// in_rows: rows `in` holds (capacity); out_rows: rows `out` holds. residual, weight,
// residual_out are read by the fused algorithm only (residual / residual_out hold in_rows rows).
extern "C" int hc_gather_tokens(const GroupArgs* g, int algorithm, int dtype, int tp, int partial,
                                const void* in, void* out, const void* residual, const void* weight,
                                void* residual_out, float eps, const int32_t* sizes_device,
                                const int32_t* sizes_host, const int32_t* own_count, int64_t row_bytes,
                                int64_t in_rows, int64_t out_rows, int pdl, cudaStream_t stream) {
  int status = 0;  // cudaError_t of the launch
  if (row_bytes % kRowAlignBytes || tp < 1 || g->nranks % tp || (algorithm == kGatherTokensTwoShot && !partial) ||
      (own_count && !sizes_device))
    return (int)cudaErrorInvalidValue;
  const RowsArg io = rows_arg(sizes_device, sizes_host, g->nranks / tp, row_bytes, in_rows, out_rows, own_count);
  const int64_t work = grid_rows(io, g->nranks / tp, RowsSpan::kAll, out_rows) * io.row_lanes;
  // Fused: a block a row (its norm sums the row), so full blocks.
  const Grid grid = algorithm == kGatherTokensFused ? Grid{blocks_for(work, *g), kThreads} : spread_grid(work, *g);
  const auto* x = (const uint2*)in;
  auto* y = (uint2*)out;
  const auto *res = (const uint2*)residual, *w = (const uint2*)weight;
  auto* res_out = (uint2*)residual_out;
  HC_DISPATCH_DTYPE(dtype, {
    const bool own = own_count != nullptr;
    if (algorithm == kGatherTokensOneShot)
      status = launch_gather_tokens<Elem, kGatherTokensOneShot>(own, grid, stream, pdl, *g, tp, partial, x, y, res, w,
                                                                res_out, eps, io);
    else if (algorithm == kGatherTokensTwoShot)
      status = launch_gather_tokens<Elem, kGatherTokensTwoShot>(own, grid, stream, pdl, *g, tp, partial, x, y, res, w,
                                                                res_out, eps, io);
    else
      status = launch_gather_tokens<Elem, kGatherTokensFused>(own, grid, stream, pdl, *g, tp, partial, x, y, res, w,
                                                              res_out, eps, io);
  });
  return status;
}
