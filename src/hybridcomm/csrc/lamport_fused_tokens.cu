// gather_tokens with residual add + RMSNorm fused, on the Lamport protocol (lamport.cuh):
// algorithm fused_lamport. The group is the world, ranks numbered rank = d * tp + t (DP group d,
// attention-TP rank t); DP group d holds counts[d] rows, partial over its tp ranks (or replicated).
//
//  1. partial rows (tp > 1): each rank pushes its group's rows to its tp peers, 16 data bytes a
//     store;
//  2. every rank of a group sums all the group's rows over tp (each needs every row's
//     residual_out), adds the residual and normalises them, a block a row; the rank whose chunk
//     holds a row (chunk_owner) pushes the normed row to every rank outside the group;
//  3. every rank copies the other groups' normed rows as they arrive from those ranks.
// So one DP group (pure attention TP) is an all-reduce with the norm in its epilogue (step 3 has
// nothing to do), and tp = 1 (attention DP) a norm with an all-gather after it (step 1 has
// nothing to do): one hop each; DP x TP takes two, as the LL kernel (gather_tokens.cu
// gather_fused), with half its bytes. Step 1's units come from my tp peers and step 3's from
// other groups' ranks, so both fit one slot's areas (one per source); unit i of a group's rows is
// unit i of the area in both.
//
// Bits: the rows are gather_fused's (fused_row.cuh), except that what travels goes through
// fix_reserved (reserved.cuh), my own output rows too, so that every rank holds the same bits: a
// normed value whose bits are all ones (none that arithmetic makes: the GPU's NaNs are canonical)
// would lose its lowest bit.
#include "fused_row.cuh"
#include "launch.cuh"
#include "own_count.cuh"

namespace hc {

// The fingerprint's width field carries this in its high byte, so that peers running the
// unfused Lamport gather (nothing there) or a quantized one (quant_rows.cuh quant_fields, all
// below 32) disagree with this kernel.
constexpr uint32_t kFusedNormWidthField = 32u << 24;

// Step 3: every unit of the other groups' rows, from the rank whose chunk holds its row.
__device__ __forceinline__ void receive_other_groups(const LamportCall& lc, int tp, int d, const RowCounts& rc,
                                                     int64_t units, uint4* __restrict__ out, int64_t out_units) {
  const int dp = lc.cx.g.nranks / tp;
  const int64_t total = rc.offset[dp] * units;
  for (int64_t o = grid_thread(); o < total; o += grid_threads()) {
    const int od = rc.holder(o, dp, units);  // the DP group of output unit o
    if (od == d) continue;
    const int64_t i = o - rc.offset[od] * units;
    const int holder = od * tp + chunk_owner(quot(i, units), rc.count(od), tp);
    uint4 data[1];  // one source (call.cuh wait_all: why not kMaxRanks)
    wait_units(lc, 1, holder, i, [](int) { return true; }, data);
    if (o < out_units) out[o] = data[0];
  }
}

// KU: units a thread works in a row (kThreads threads a row). kOwn: own-count mode
// (own_count.cuh): io.sizes.own is this DP group's count alone. kSum: partial rows over tp > 1
// (step 1); else a row is my own input alone.
template <typename T, int KU, bool kOwn, bool kSum>
__global__ void __launch_bounds__(kThreads)
    lamport_gather_tokens_norm(GroupArgs g, const __grid_constant__ LamportArgs l, int tp, int partial,
                               const uint4* __restrict__ in, uint4* __restrict__ out, Fusion fu, RowsArg io) {
  extern __shared__ float4 staged_[];  // the block's row, fp32
  float* row = reinterpret_cast<float*>(staged_);
  __shared__ float warp_buf[kThreads / 32];

  LamportCall lc = begin_lamport_call(g, l, kGatherTokens);
  const int me = g.me, dp = g.nranks / tp, d = me / tp, t = me % tp;
  const int64_t units = io.row_lanes / 2, out_units = io.out_rows * units;
  // Loaded early: the units step 1 sends, or those of the block's first row.
  constexpr UnitOrder kOrder = kSum ? UnitOrder::kSendOrder : UnitOrder::kRowOrder;
  const EarlyUnits<KU, kOrder> input = early_units<KU, kOrder>(in, io.in_rows * units, units);
  RowCounts rc = lamport_counts(lc, counted<kOwn>(io, d).sizes, dp, units);
  if constexpr (kOwn) rc.hash = kOwnCountsHash;
  check_buffers(lc.cx, rc.count(d) > io.in_rows || rc.offset[dp] > io.out_rows);
  const int variant = (tp - 1) | (partial ? 8 : 0);  // (rows.cuh TokenShape::variant)
  arrive(lc.cx, make_fingerprint(kGatherTokens, Lane<T>::kDType, lc.algorithm(), variant, rc.hash,
                                 (uint64_t)units * 16 | kFusedNormWidthField));
  if constexpr (kOwn) publish_own_count(lc.cx, io, rc, d);
  if constexpr (kSum) {  // step 1
    for (int64_t i = grid_thread(); i < rc.count(d) * units; i += grid_threads()) {
      const uint4 v = fix_reserved<T>(input.at(i));  // load_unit's (zero stays zero)
      lc.cx.everyone().for_each_other([&](int peer) {
        if (peer / tp == d) put_unit(lc.cx, lc.outbox(peer) + i, v);
      });
    }
  }
  refill_previous_slot(lc);
  // Own-count mode: my group's place in the output is known once every count is (learn_counts).
  // Partial rows learn it now, before waiting for any tp peer's rows (tp peers that disagree on
  // the count must not be waited for). Rows that wait for nothing are normed and sent first; they
  // wait in my own area of this slot (the area "from me", which no peer writes and the re-fill
  // skips), and the thread that wrote a unit copies it out.
  constexpr bool kStaged = kOwn && !kSum;
  if constexpr (kOwn && kSum) learn_counts(lc.cx, io, tp, rc);
  const int64_t my_out = rc.offset[d] * units;  // (kStaged: not yet known)
  uint4* const staged = lc.inbox(me);
  const auto mine = [&](int64_t i) { return fix_reserved<T>(input.at(i)); };
  for (int64_t r = blockIdx.x; r < rc.count(d); r += gridDim.x) {  // step 2
    const float scale = stage_fused_row<T, KU>(lc, kSum ? tp : 1, kSum ? d * tp : me, kSum ? t : 0, r, mine, fu,
                                               units, io.in_rows, row, warp_buf);
    const bool sender = dp > 1 && chunk_owner(r, rc.count(d), tp) == t;
#pragma unroll 1
    for (int k = 0; k < KU; ++k) {
      const int64_t u = threadIdx.x + (int64_t)k * kThreads, i = r * units + u;
      if (u >= units) continue;
      float v[kUnitValues<T>];
      const uint4 p = fix_reserved<T>(normed_unit<T>(row, u, scale, fu.weight, v));
      if (sender) {
        lc.cx.everyone().for_each_other([&](int peer) {
          if (peer / tp != d) put_unit(lc.cx, lc.outbox(peer) + i, p);
        });
      }
      if constexpr (kStaged) staged[i] = p;
      else if (my_out + i < out_units) out[my_out + i] = p;
    }
  }
  if constexpr (kStaged) {
    learn_counts(lc.cx, io, tp, rc);
    for (int64_t r = blockIdx.x; r < rc.count(d); r += gridDim.x) {  // (zero after an error)
      for (int64_t u = threadIdx.x; u < units; u += kThreads) {
        const int64_t i = r * units + u, o = rc.offset[d] * units + i;
        if (o < out_units) out[o] = staged[i];
      }
    }
  }
  if (dp > 1) receive_other_groups(lc, tp, d, rc, units, out, out_units);  // step 3
  end_lamport_call(lc, rc.max * units);  // nobody wrote more than the largest group's rows to me
}

// A block a row of the largest group (bounded by the output: step 3 covers every group's rows;
// bounded by my input instead, a rank holding 1 row of (64, 1) got one block for 64 rows, 83 us
// against 11 on one shared H100), full blocks. KU = units a thread (an instance each: 16-bit rows
// to 1536 units, fp32 to 3072; kMaxQuantHidden, the staging's bound, is below both).
template <typename T>
int launch_norm(const GroupArgs* g, const LamportArgs* l, int tp, int partial, const void* in, void* out,
                const Fusion& fu, const RowsArg& io, int64_t hidden, int pdl, cudaStream_t stream) {
  const int64_t rows = grid_rows(io, g->nranks / tp, RowsSpan::kLargest, io.out_rows);
  const int64_t units = hidden * (int64_t)sizeof(T) / kLamportUnitBytes, ku = ceil_div(units, kThreads);
  const Grid grid{(int)(rows < 1 ? 1 : rows < g->max_blocks ? rows : g->max_blocks), kThreads};
  const size_t smem = (size_t)hidden * sizeof(float);
  const bool sum = partial && tp > 1;
  const auto launch = [&](auto k) {
    constexpr int KU = decltype(k)::value;
    const auto kernel = sum ? (io.sizes.own ? lamport_gather_tokens_norm<T, KU, true, true>
                                            : lamport_gather_tokens_norm<T, KU, false, true>)
                            : (io.sizes.own ? lamport_gather_tokens_norm<T, KU, true, false>
                                            : lamport_gather_tokens_norm<T, KU, false, false>);
    return launch_kernel_smem(kernel, grid.blocks, grid.threads, smem, stream, pdl, *g, *l, tp, partial,
                              (const uint4*)in, (uint4*)out, fu, io);
  };
  if (ku <= 1) return launch(std::integral_constant<int, 1>{});
  if (ku <= 2) return launch(std::integral_constant<int, 2>{});
  if (ku <= 3) return launch(std::integral_constant<int, 3>{});
  return launch(std::integral_constant<int, sizeof(T) == 4 ? 6 : 3>{});
}

}  // namespace hc

using namespace hc;

// hc_gather_tokens' arguments for the fused algorithm (residual, weight, residual_out, eps), on
// the group's Lamport areas. Rows of whole 16-byte units, hidden at most kMaxQuantHidden (the
// staged row's shared memory).
extern "C" int hc_lamport_gather_tokens_norm(const GroupArgs* g, const LamportArgs* l, int dtype, int tp, int partial,
                                             const void* in, void* out, const void* residual, const void* weight,
                                             void* residual_out, float eps, const int32_t* sizes_device,
                                             const int32_t* sizes_host, const int32_t* own_count, int64_t row_bytes,
                                             int64_t in_rows, int64_t out_rows, int pdl, cudaStream_t stream) {
  const bool rows_here = in_rows > 0;  // (an empty tensor's pointer may be null)
  if (row_bytes % kLamportUnitBytes || tp < 1 || g->nranks % tp || !weight ||
      (rows_here && (!residual || !residual_out)) || (own_count && !sizes_device))
    return (int)cudaErrorInvalidValue;
  const Fusion fu{(const uint4*)residual, (const uint4*)weight, (uint4*)residual_out, eps};
  const RowsArg io = rows_arg(sizes_device, sizes_host, g->nranks / tp, row_bytes, in_rows, out_rows, own_count);
  HC_DISPATCH_DTYPE(dtype, {
    const int64_t hidden = row_bytes / (int64_t)sizeof(Elem);
    if (hidden > kMaxQuantHidden) return (int)cudaErrorInvalidValue;
    return launch_norm<Elem>(g, l, tp, partial, in, out, fu, io, hidden, pdl, stream);
  });
  return (int)cudaErrorInvalidValue;
}
