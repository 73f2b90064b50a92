// gather_tokens with residual add + RMSNorm fused, on the Lamport protocol (lamport.cuh), in
// one hop: algorithm fused_lamport. The group is the world, ranks numbered rank = dp * tp + t.
// One hop suffices in two layouts, one kernel path each:
//
//   reduce first (one DP group, partial rows: pure attention TP): every rank pushes its partial
//     rows to every peer, 16 data bytes a store; every rank sums every row over tp, adds the
//     residual and normalises it itself (a block a row). An all-reduce with the norm in its
//     epilogue.
//   norm first (one rank per DP group: attention DP): every rank adds the residual to its own
//     rows and normalises them (a block a row), then pushes the normed rows to every peer and
//     copies what arrives into its output. A norm with an all_gather_v after it, in one kernel.
//
// Elsewhere (DP x TP with attn_dp > 1, or replicated rows with attn_tp > 1) a row's sum and its
// residual are on different ranks, and the LL kernel's two hops run it (gather_tokens.cu
// gather_fused; the nvlink backend chooses). Every rank's rows are gather_fused's, bit for bit
// (fused_row.cuh), except that what travels goes through fix_reserved (reserved.cuh): a normed
// value whose bits are all ones (none that arithmetic makes: NaNs come out canonical) would
// lose its lowest bit.
#include "fused_row.cuh"
#include "launch.cuh"
#include "own_count.cuh"

namespace hc {

// The fingerprint's width field carries this in its high byte, so that peers running the
// unfused Lamport gather (nothing there) or a quantized one (quant_rows.cuh quant_fields, all
// below 32) disagree with this kernel.
constexpr uint32_t kFusedNormWidthField = 32u << 24;

// Reduce first: every row is my group's (one DP group), so output row = row of the group.
template <typename T, int KU, bool kOwn>
__device__ __forceinline__ void reduce_then_norm(LamportCall& lc, int tp, RowCounts& rc, const uint4* __restrict__ in,
                                                 uint4* __restrict__ out, const Fusion& fu, const RowsArg& io,
                                                 float* row, float* warp_buf) {
  const int t = lc.cx.g.me % tp;
  const int64_t units = io.row_lanes / 2, out_units = io.out_rows * units;
  const EarlyUnits<KU> input = early_units<KU>(in, io.in_rows * units);
  for (int64_t i = grid_thread(); i < rc.count(0) * units; i += grid_threads()) {
    const uint4 v = fix_reserved<T>(input.at(i));  // load_unit's (zero stays zero)
    lc.cx.everyone().for_each_other([&](int peer) { put_unit(lc.cx, lc.outbox(peer) + i, v); });
  }
  refill_previous_slot(lc);
  if constexpr (kOwn) learn_counts(lc.cx, io, tp, rc);  // (the same count on every rank: it checks that)
  const auto mine = [&](int64_t i) { return fix_reserved<T>(input.at(i)); };
  for (int64_t r = blockIdx.x; r < rc.count(0); r += gridDim.x) {
    const float scale = stage_fused_row<T, KU>(lc, tp, 0, t, r, mine, fu, units, io.in_rows, row, warp_buf);
#pragma unroll 1
    for (int k = 0; k < KU; ++k) {
      const int64_t u = threadIdx.x + (int64_t)k * kThreads, o = r * units + u;
      float v[kUnitValues<T>];
      if (u < units && o < out_units) out[o] = normed_unit<T>(row, u, scale, fu.weight, v);
    }
  }
}

// Norm first (tp = 1: DP group = rank). In own-count mode my rows' place in the output is known
// only after learn_counts, which waits for every peer's count: my normed rows wait in my own
// Lamport area of this slot (the area "from me", which no peer writes and the re-fill skips) and
// are copied from there by the thread that wrote them.
template <typename T, int KU, bool kOwn>
__device__ __forceinline__ void norm_then_gather(LamportCall& lc, RowCounts& rc, const uint4* __restrict__ in,
                                                 uint4* __restrict__ out, const Fusion& fu, const RowsArg& io,
                                                 float* row, float* warp_buf) {
  const int me = lc.cx.g.me, n = lc.cx.g.nranks;
  const int64_t units = io.row_lanes / 2, out_units = io.out_rows * units;
  const EarlyUnits<KU, UnitOrder::kRowOrder> input = early_units<KU, UnitOrder::kRowOrder>(in, io.in_rows * units,
                                                                                          units);
  const auto mine = [&](int64_t i) { return fix_reserved<T>(input.at(i)); };
  uint4* const staged = lc.inbox(me);
  const int64_t my_rows = rc.count(me);  // (own-count mode: known from the start)
  const int64_t my_out = rc.offset[me] * units;  // (own-count mode: not yet)
  for (int64_t r = blockIdx.x; r < my_rows; r += gridDim.x) {
    const float scale = stage_fused_row<T, KU>(lc, 1, me, 0, r, mine, fu, units, io.in_rows, row, warp_buf);
#pragma unroll 1
    for (int k = 0; k < KU; ++k) {
      const int64_t u = threadIdx.x + (int64_t)k * kThreads, i = r * units + u;
      if (u >= units) continue;
      float v[kUnitValues<T>];
      const uint4 p = fix_reserved<T>(normed_unit<T>(row, u, scale, fu.weight, v));
      lc.cx.everyone().for_each_other([&](int peer) { put_unit(lc.cx, lc.outbox(peer) + i, p); });
      if constexpr (kOwn) staged[i] = p;
      else if (my_out + i < out_units) out[my_out + i] = p;
    }
  }
  refill_previous_slot(lc);
  if constexpr (kOwn) {
    learn_counts(lc.cx, io, 1, rc);
    for (int64_t r = blockIdx.x; r < rc.count(me); r += gridDim.x) {  // (zero after an error)
      for (int64_t u = threadIdx.x; u < units; u += kThreads) {
        const int64_t i = r * units + u, o = rc.offset[me] * units + i;
        if (o < out_units) out[o] = staged[i];
      }
    }
  }
  // The peers' normed rows, as lamport_all_gather_v.cu receives rows. Written out, not shared: as
  // one helper of both kernels, these instances spilled 56-68 bytes at 128 registers.
  for (int64_t i = grid_thread(); i < rc.max * units; i += grid_threads()) {
    uint4 data[kMaxRanks];
    const uint32_t received =
        wait_units(lc, n, 0, i, [&](int s) { return s != me && i < rc.count(s) * units; }, data);
#pragma unroll
    for (int s = 0; s < kMaxRanks; ++s) {
      const int64_t o = rc.offset[s] * units + i;
      if (((received >> s) & 1u) && o < out_units) out[o] = data[s];
    }
  }
}

// KU: units a thread works in a row (kThreads threads a row). kOwn: own-count mode
// (own_count.cuh): io.sizes.own is this DP group's count alone. kNormFirst: tp = 1, else tp is the
// world (reduce first); an instance each, so that neither path's registers bound the other's
// (together, the 16-bit instances spilled).
template <typename T, int KU, bool kOwn, bool kNormFirst>
__global__ void __launch_bounds__(kThreads)
    lamport_gather_tokens_norm(GroupArgs g, const __grid_constant__ LamportArgs l, int tp,
                               const uint4* __restrict__ in, uint4* __restrict__ out, Fusion fu, RowsArg io) {
  extern __shared__ float4 staged_[];  // the block's row, fp32
  float* row = reinterpret_cast<float*>(staged_);
  __shared__ float warp_buf[kThreads / 32];

  LamportCall lc = begin_lamport_call(g, l, kGatherTokens);
  const int dp = g.nranks / tp, d = g.me / tp;
  const int64_t units = io.row_lanes / 2;
  RowCounts rc = lamport_counts(lc, counted<kOwn>(io, d).sizes, dp, units);
  if constexpr (kOwn) rc.hash = kOwnCountsHash;
  check_buffers(lc.cx, rc.count(d) > io.in_rows || rc.offset[dp] > io.out_rows);
  const int variant = (tp - 1) | (tp > 1 ? 8 : 0);  // (rows.cuh TokenShape::variant: partial over tp > 1)
  arrive(lc.cx, make_fingerprint(kGatherTokens, Lane<T>::kDType, lc.algorithm(), variant, rc.hash,
                                 (uint64_t)units * 16 | kFusedNormWidthField));
  if constexpr (kOwn) publish_own_count(lc.cx, io, rc, d);
  if constexpr (kNormFirst) norm_then_gather<T, KU, kOwn>(lc, rc, in, out, fu, io, row, warp_buf);
  else reduce_then_norm<T, KU, kOwn>(lc, tp, rc, in, out, fu, io, row, warp_buf);
  end_lamport_call(lc, rc.max * units);  // reduce first: every rank wrote rc.count(0) rows; norm first: its own
}

// A block a row of the largest count, full blocks, KU = units a thread (an instance each: 16-bit
// rows to 1536 units, fp32 to 3072; kMaxQuantHidden, the staging's bound, is below both). Norm
// first bounds the grid by the output, not by my input: its receive loop covers every peer's rows
// (sized by my own rows, a rank with 1 of (64, 1) got one block for 64 rows: 83 us against 11).
template <typename T>
int launch_norm(const GroupArgs* g, const LamportArgs* l, int tp, const void* in, void* out, const Fusion& fu,
                const RowsArg& io, int64_t hidden, int pdl, cudaStream_t stream) {
  const int64_t rows = grid_rows(io, g->nranks / tp, RowsSpan::kLargest, tp == 1 ? io.out_rows : io.in_rows);
  const int64_t units = hidden * (int64_t)sizeof(T) / kLamportUnitBytes, ku = ceil_div(units, kThreads);
  const Grid grid{(int)(rows < 1 ? 1 : rows < g->max_blocks ? rows : g->max_blocks), kThreads};
  const size_t smem = (size_t)hidden * sizeof(float);
  const auto launch = [&](auto k) {
    constexpr int KU = decltype(k)::value;
    const auto kernel = tp == 1 ? (io.sizes.own ? lamport_gather_tokens_norm<T, KU, true, true>
                                                : lamport_gather_tokens_norm<T, KU, false, true>)
                                : (io.sizes.own ? lamport_gather_tokens_norm<T, KU, true, false>
                                                : lamport_gather_tokens_norm<T, KU, false, false>);
    return launch_kernel_smem(kernel, grid.blocks, grid.threads, smem, stream, pdl, *g, *l, tp, (const uint4*)in,
                              (uint4*)out, fu, io);
  };
  if (ku <= 1) return launch(std::integral_constant<int, 1>{});
  if (ku <= 2) return launch(std::integral_constant<int, 2>{});
  if (ku <= 3) return launch(std::integral_constant<int, 3>{});
  return launch(std::integral_constant<int, sizeof(T) == 4 ? 6 : 3>{});
}

}  // namespace hc

using namespace hc;

// hc_gather_tokens' arguments for the fused algorithm (residual, weight, residual_out, eps), on
// the group's Lamport areas, for the layouts of one hop only: tp = the world with partial rows,
// or tp = 1. Rows of whole 16-byte units, hidden at most kMaxQuantHidden (the staged row's
// shared memory).
extern "C" int hc_lamport_gather_tokens_norm(const GroupArgs* g, const LamportArgs* l, int dtype, int tp, int partial,
                                             const void* in, void* out, const void* residual, const void* weight,
                                             void* residual_out, float eps, const int32_t* sizes_device,
                                             const int32_t* sizes_host, const int32_t* own_count, int64_t row_bytes,
                                             int64_t in_rows, int64_t out_rows, int pdl, cudaStream_t stream) {
  const bool one_hop = tp == 1 || (tp == g->nranks && partial);
  const bool rows_here = in_rows > 0;  // (an empty tensor's pointer may be null)
  if (row_bytes % kLamportUnitBytes || !one_hop || !weight || (rows_here && (!residual || !residual_out)) ||
      (own_count && !sizes_device))
    return (int)cudaErrorInvalidValue;
  const Fusion fu{(const uint4*)residual, (const uint4*)weight, (uint4*)residual_out, eps};
  const RowsArg io = rows_arg(sizes_device, sizes_host, g->nranks / tp, row_bytes, in_rows, out_rows, own_count);
  HC_DISPATCH_DTYPE(dtype, {
    const int64_t hidden = row_bytes / (int64_t)sizeof(Elem);
    if (hidden > kMaxQuantHidden) return (int)cudaErrorInvalidValue;
    return launch_norm<Elem>(g, l, tp, in, out, fu, io, hidden, pdl, stream);
  });
  return (int)cudaErrorInvalidValue;
}
