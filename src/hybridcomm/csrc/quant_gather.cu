// Quantized gathers: gather_tokens (optionally fused with residual add + RMSNorm) and
// all_gather_v whose rows travel quantized (fp8, fp8_block128, nvfp4; quant.cuh and
// docs/quantization.md), on LL packets. Ownership, staging and quantizing: quant_rows.cuh
// (shared with the Lamport variant, lamport_quant_gather.cu). Each owner pushes its wire row
// -- data lanes, then scale lanes, 8 bytes each -- to every rank that receives it.
//
//   phase 0 (partial rows, tp > 1): lanes of a row go to its owner, or (replicated: the one-hop
//           algorithm, fused rows) to every tp peer; they are summed in tp order.
//   per row (a row team: quant_rows.cuh): fp32 values rounded once to T (after the fused
//           add + RMSNorm, in gather_tokens.cu's order), in registers (fused: through shared
//           memory); quantized by the owner -- replicated, by every tp rank of the group, each
//           keeping its copy -- and pushed by the owner.
//   phase 1: every rank copies the wire rows it did not quantize into data / scales.
//
// Device-side counts, capacity checks and bounded waits as in gather_tokens.cu.
#include "own_count.cuh"
#include "quant_rows.cuh"

namespace hc {

// Where a quantized row goes: 8-byte wire lanes, data first, then the scale bytes.
struct WireRows {
  QuantOut out;
  int64_t wire_lanes;

  // Wire lane l of output row o into data / scales.
  __device__ __forceinline__ void store(int64_t o, int64_t l, uint2 v) const {
    if (o >= out.out_rows) return;
    if (l < out.data_lanes) out.data[o * out.data_lanes + l] = v;
    else out.store_scales(o, (l - out.data_lanes) * 8, v);
  }
};

template <int F>
__host__ __device__ __forceinline__ WireRows wire_rows(int64_t hidden, void* data, void* scales, int64_t out_rows) {
  const QuantOut out = quant_out<F>(hidden, data, scales, out_rows);
  return WireRows{out, out.data_lanes + (out.scale_bytes + 7) / 8};
}

// Row r of my group, quantized (q: my lanes), to `to` (an EmitTo): into my output, and, if I
// own it, to every rank that receives it (area 1, at the row's group-local wire lanes; none
// after an abort: put_lane). Called by the whole team.
template <int F, int KL, int W>
__device__ __forceinline__ void push_quantized_row(const CallCtx& cx, const TokenShape& s, bool replicated, int64_t r,
                                                   bool owned, const QuantizedLanes<KL>& q, int to,
                                                   const WireRows& w) {
  const int64_t o = s.rc.offset[s.d] + r, base = r * w.wire_lanes;  // (o: once the counts are known)
  const bool receivers = (to & kToReceivers) && owned;
  const auto emit = [&](int64_t l, uint2 v) {
    if (to & kToMine) w.store(o, l, v);
    if (receivers) for_each_receiver(cx, s, replicated, [&](int peer) { put_lane(cx, peer, 1, base + l, v); });
  };
  emit_lanes<F, 1, KL, W>(
      q, w.out.data_lanes, w.wire_lanes - w.out.data_lanes, [&](int64_t l, const uint2(&v)[1]) { emit(l, v[0]); },
      [&](int64_t sl, uint2 v) { emit(w.out.data_lanes + sl, v); });
}

// M: the RowMode (quant_rows.cuh). kOwn: own-count mode (own_count.cuh): io.sizes.own is this
// DP group's count alone. Plain rows' instances are bound to one block an SM (as their grids
// are: blocks_for): left free, ptxas gave the given-count nvfp4 one 64 registers and 28 / 32
// bytes of spills, and a 128-token DP2 call took 1.23x the time (run 78 of results/shared_1xH100;
// scripts/kernel_resources.py: with the bound no plain instance spills; 0 leaves the others as
// they were).
template <typename T, int F, int KL, int W, int M, bool kOwn>
__global__ void __launch_bounds__(kThreads, M == kRowsPlain ? 1 : 0)
    quant_gather(GroupArgs g, int op, int algorithm, int tp, int partial, const uint2* __restrict__ in,
                 const uint2* __restrict__ residual, const uint2* __restrict__ weight,
                 uint2* __restrict__ residual_out, float eps, const float* __restrict__ global_scale_ptr,
                 WireRows w, RowsArg io) {
  extern __shared__ float4 staged_[];  // a fused row's fp32 values (stage_row)
  float* row = reinterpret_cast<float*>(staged_);
  __shared__ float warp_buf[kThreads / 32];

  CallCtx cx = begin_call(g, op);
  // Fused iff a norm weight is given (the launcher's row_mode: never empty; an empty residual of a
  // rank with no rows has a null pointer, so it cannot tell).
  const RowPlan plan = row_plan(M, algorithm, tp, partial);
  // Loaded before the counts and arrive(): their latency overlaps the prologue's.
  constexpr bool kSplits = M == kRowsPlain;  // (splits_rows: only plain rows' teams may split)
  const RowInput<T, F, KL, kSplits> early =
      early_row_input<T, F, KL, W, kSplits>(in, plan.from_row_zero, plan.fused, io, w.out.data_lanes);
  const float global_scale = global_scale_ptr ? *global_scale_ptr : 0.f;
  // Areas hold the larger of a partial input row (phase 0) and a wire row (phase 1).
  constexpr bool own = kOwn;
  TokenShape s = token_shape(cx, tp, counted<kOwn>(io, g.me / tp).sizes,
                             io.row_lanes > w.wire_lanes ? io.row_lanes : w.wire_lanes);
  s.row_lanes = io.row_lanes;
  if (own) s.rc.hash = kOwnCountsHash;
  check_buffers(cx, s.rc.count(s.d) > io.in_rows || s.rc.offset[s.dp] > io.out_rows);
  // Peers must agree on the format, the fusion and who sums partial rows: all go in the algorithm field.
  arrive(cx, make_fingerprint(op, Lane<T>::kDType, quant_fields<F>(plan.fused, plan.replicated),
                              s.variant(partial), s.rc.hash, (uint64_t)io.row_lanes * 8));
  if (own) publish_own_count(cx, io, s.rc, s.d);
  stage_my_rows<T, F, KL, W, kSplits>(cx, s, plan, in, residual, weight, residual_out, eps, global_scale, io,
                                      w.out.data_lanes, early, row, warp_buf, own,
                                      [&] { if (own) learn_counts(cx, io, tp, s.rc); },
                                      [&](int64_t r, const QuantizedLanes<KL>& q, bool owned, int to) {
                                        push_quantized_row<F, KL, W>(cx, s, plan.replicated, r, owned, q, to, w);
                                      });
  HC_TRACE_EVENT(kTraceSent);
  // Phase 1: the rows other ranks own (replicated: of other DP groups).
  for_each_foreign_item(s, g.me, plan.replicated, w.wire_lanes,
                        [&](int64_t o, int64_t l, int owner, int64_t j, int64_t) {
    w.store(o, l, wait_lane(cx, 1, owner, j * w.wire_lanes + l));
  });
  end_call(cx);
}

}  // namespace hc

using namespace hc;

// algorithm: a QuantGatherAlgorithm (who sums partial rows: quant_rows.cuh); format: a
// QuantFormat; op: the Op code errors are reported under (kGatherTokens, kAllGatherV).
// residual / weight / residual_out: the fused add + RMSNorm (null: not fused). global_scale:
// device fp32 (nvfp4; null otherwise). out_data: out_rows x data bytes; out_scales: out_rows x
// scale bytes (hybridcomm.quant.formats). hidden: a multiple of 16, at most kMaxQuantHidden;
// in_rows / out_rows: rows the buffers hold (capacity). own_count: this rank's (DP group's)
// count alone, or null (as in hc_gather_tokens: sizes_device receives every member's). pdl:
// launch overlapping the previous kernel (pdl.cuh; the kernel touches no memory before
// begin_call's wait).
extern "C" int hc_quant_gather(const GroupArgs* g, int algorithm, int format, int dtype, int tp, int partial, int op,
                               const void* in, const void* residual, const void* weight, void* residual_out,
                               float eps, const float* global_scale, void* out_data, void* out_scales,
                               const int32_t* sizes_device, const int32_t* sizes_host, const int32_t* own_count,
                               int64_t hidden, int64_t in_rows, int64_t out_rows, int pdl, cudaStream_t stream) {
  if (!quant_args_valid(g, algorithm, format, tp, hidden, global_scale, sizes_device, own_count) ||
      algorithm == kQuantGatherLocal)  // (a Lamport algorithm)
    return (int)cudaErrorInvalidValue;
  int status = 0;
  HC_DISPATCH_DTYPE(dtype, HC_DISPATCH_QUANT(format, {
    const RowsArg io = rows_arg(sizes_device, sizes_host, g->nranks / tp, hidden * sizeof(Elem), in_rows, out_rows,
                                own_count);
    const WireRows w = wire_rows<Fmt>(hidden, out_data, out_scales, out_rows);
    const int mode = row_mode(weight != nullptr, partial, tp);
    const RowPlan plan = row_plan(mode, algorithm, tp, partial);
    const Grid grid = quant_grid(io, *g, tp, plan, splits_rows<Fmt>(mode, io.row_lanes), w.wire_lanes);
    // Teams of kThreads only: narrow teams made this kernel slower on NVLink (team_threads).
    status = with_kernel_instance<Fmt, false>(w.out.data_lanes, mode, own_count != nullptr,
                                       [&](auto kl, auto team, auto m, auto own) {
      const auto kernel = quant_gather<Elem, Fmt, decltype(kl)::value, decltype(team)::value, decltype(m)::value,
                                       decltype(own)::value>;
      return launch_kernel_smem(kernel, grid.blocks, grid.threads, quant_staging_bytes(hidden), stream, pdl, *g, op,
                                algorithm, tp, partial, (const uint2*)in, (const uint2*)residual,
                                (const uint2*)weight, (uint2*)residual_out, eps, global_scale, w, io);
    });
  }));
  return status;
}
