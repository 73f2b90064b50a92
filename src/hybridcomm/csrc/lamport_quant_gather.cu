// Quantized gathers on the Lamport protocol (lamport.cuh): the rows of quant_gather.cu --
// owned, staged and quantized by quant_rows.cuh's functions -- travel as 16-byte Lamport units
// (16 data bytes per store, no flags) instead of LL packets (8 per store), so the quantized
// bytes cross NVLink once, not doubled.
//
// Wire row (in every area): the data units, then the scale units; each part padded to whole
// 16-byte units with zero words (an nvfp4 row of hidden / 16 odd ends its data in half a unit).
// Row j of DP group d goes, by its owner (tp rank t of d), to unit (j - chunk_begin(count(d), t,
// tp)) * wire_units of the owner's area in every other rank's current slot: at most
// ceil(max count / tp) rows per area, what end_lamport_call records for the re-fill.
//
//   phase 0 (partial rows, tp > 1): unchanged from quant_gather.cu: LL lanes to the owner
//           (replicated: to every tp peer), in LL area 0.
//   per row (a row team): in registers (fused: staged), one lane quantized per thread; even
//           threads of the owner put a unit (their lane and the next thread's), the scale
//           lanes go as 8-byte unit halves; my copy stored.
//   phase 1: every rank waits for the units of the rows it did not quantize and stores them.
//
// Reserved pattern (docs/quantization.md): no wire word may be the sentinel 0xFFFFFFFF. fp8
// data bytes are never 0xFF (e4m3 NaN is 0x7f), fp32 and e4m3 scales are never negative, pads
// are zero; nvfp4 data words can be 0xFFFFFFFF (eight -6.0s), so they travel as 0x88888888
// (eight -0 codes, which the quantizer never writes: zero is always code 0) and are swapped
// back on receipt.
#include "lamport.cuh"
#include "lamport_quant_local.h"
#include "own_count.cuh"
#include "quant_rows.cuh"

namespace hc {

constexpr uint32_t kNvfp4WireStandIn = 0x88888888u;  // stands in for 0xFFFFFFFF on the wire

// A data unit as it travels (to_wire; nvfp4: the sentinel word replaced by its stand-in) or back.
template <int F>
__device__ __forceinline__ uint4 wire_swap(uint4 v, bool to_wire) {
  if constexpr (F != kQuantNvfp4) return v;
  const uint32_t from = to_wire ? kSentinelWord : kNvfp4WireStandIn, to = to_wire ? kNvfp4WireStandIn : kSentinelWord;
  return make_uint4(v.x == from ? to : v.x, v.y == from ? to : v.y, v.z == from ? to : v.z, v.w == from ? to : v.w);
}

// Where a quantized row goes, in 16-byte units: data units first, then scale units.
struct WireUnits {
  QuantOut out;
  int64_t data_units, wire_units;

  // Unit u of output row o into data / scales (pads dropped).
  __device__ __forceinline__ void store(int64_t o, int64_t u, uint4 v) const {
    if (o >= out.out_rows) return;
    if (u >= data_units) return out.store_scales(o, (u - data_units) * 16, v);
    const int64_t l = 2 * u;
    out.data[o * out.data_lanes + l] = make_uint2(v.x, v.y);
    if (l + 1 < out.data_lanes) out.data[o * out.data_lanes + l + 1] = make_uint2(v.z, v.w);
  }
};

template <int F>
__host__ __device__ __forceinline__ WireUnits wire_units(int64_t hidden, void* data, void* scales, int64_t out_rows) {
  const QuantOut out = quant_out<F>(hidden, data, scales, out_rows);
  const int64_t data_units = (out.data_lanes + 1) / 2;
  return WireUnits{out, data_units, data_units + (out.scale_bytes + 15) / 16};
}

// Area rows one source writes into one of my areas: its chunk of a DP group, at most this.
__device__ __forceinline__ int64_t area_rows(const RowCounts& rc, int tp) { return (rc.max + tp - 1) / tp; }

// The row counts, checked against both areas this call uses: the Lamport area (wire rows) and,
// with phase 0, the LL area (partial input rows). On overflow every rank reaches the same
// verdict: the counts become zero, nobody sends or waits, the host raises CapacityExceeded.
__device__ __forceinline__ TokenShape quant_token_shape(const LamportCall& lc, int tp, bool reduce, const RowsArg& io,
                                                        int64_t wire_units) {
  const GroupArgs& g = lc.cx.g;
  RowCounts rc = load_counts(io.sizes, g.nranks / tp);
  const bool fits = fits_area(area_rows(rc, tp) * wire_units * kLamportUnitBytes, kLamportWireFactor, lc.l.area_bytes) &&
                    (!reduce || fits_area(rc.max * io.row_lanes * kLLUnitBytes, kLLWireFactor, g.area_bytes));
  if (!fits) {
    if (grid_thread() == 0) lc.cx.fail(kCapacity, g.me);
    const uint32_t hash = rc.hash;
    rc = RowCounts{};
    rc.hash = hash;
  }
  return TokenShape{tp, g.nranks / tp, g.me / tp, g.me % tp, rc, io.row_lanes};
}

// Half of a 16-byte unit (8 bytes, an aligned pair of words). The receiver polls the whole unit
// until none of its words is the sentinel, so the two halves may land from two stores: the
// scale lanes travel so, each formed in the warp that holds its data lanes (quant_rows.cuh).
__device__ __forceinline__ void put_half_unit(const CallCtx& cx, uint4* unit, int half, uint2 v) {
  if (cx.aborted) return;  // (as put_unit)
  asm volatile("st.volatile.global.v2.u32 [%0], {%1, %2};" ::"l"(reinterpret_cast<uint2*>(unit) + half), "r"(v.x),
               "r"(v.y)
               : "memory");
}

// Row r of my group, quantized (q: my lanes), to `to` (an EmitTo): into my output, and, if I own
// it, as units into the area from me of every rank that receives it (data: one unit, two lanes,
// per even thread; scales: 8-byte halves; none after an abort: put_unit). Called by the whole
// team.
template <int F, int KL, int W>
__device__ __forceinline__ void put_quantized_row(const LamportCall& lc, const TokenShape& s, bool replicated,
                                                  int64_t r, bool owned, const QuantizedLanes<KL>& q, int to,
                                                  const WireUnits& w) {
  const int64_t o = s.rc.offset[s.d] + r;  // (once the counts are known)
  const int64_t base = (r - chunk_begin(s.rc.count(s.d), s.t, s.tp)) * w.wire_units;
  const bool mine = to & kToMine, receivers = (to & kToReceivers) && owned;
  emit_lanes<F, 2, KL, W>(
      q, w.out.data_lanes, 2 * (w.wire_units - w.data_units),
      [&](int64_t u, const uint2(&v)[2]) {
        const uint4 unit = make_uint4(v[0].x, v[0].y, v[1].x, v[1].y);
        if (mine) w.store(o, u, unit);
        if (!receivers) return;
        const uint4 wire = wire_swap<F>(unit, true);
        for_each_receiver(lc.cx, s, replicated, [&](int peer) { put_unit(lc.cx, lc.outbox(peer) + base + u, wire); });
      },
      [&](int64_t sl, uint2 v) {
        if (mine && o < w.out.out_rows) w.out.store_scales(o, sl * 8, v);
        if (!receivers) return;
        const int64_t u = w.data_units + sl / 2;
        for_each_receiver(lc.cx, s, replicated,
                          [&](int peer) { put_half_unit(lc.cx, lc.outbox(peer) + base + u, (int)(sl % 2), v); });
      });
}

// M: the RowMode (quant_rows.cuh). kOwn: own-count mode (as in quant_gather.cu).
template <typename T, int F, int KL, int W, int M, bool kOwn>
__global__ void __launch_bounds__(kThreads)
    lamport_quant_gather(GroupArgs g, const __grid_constant__ LamportArgs l, int op, int algorithm, int tp,
                         int partial,
                         const uint2* __restrict__ in, const uint2* __restrict__ residual,
                         const uint2* __restrict__ weight, uint2* __restrict__ residual_out, float eps,
                         const float* __restrict__ global_scale_ptr, WireUnits w, RowsArg io) {
  extern __shared__ float4 staged_[];  // a fused row's fp32 values (stage_row)
  float* row = reinterpret_cast<float*>(staged_);
  __shared__ float warp_buf[kThreads / 32];

  LamportCall lc = begin_lamport_call(g, l, op);
  const RowPlan plan = row_plan(M, algorithm, tp, partial);  // (quant_gather.cu: why the weight decides M)
  // Loaded before the counts and arrive(): their latency overlaps the prologue's.
  constexpr bool kSplits = M == kRowsPlain;  // (splits_rows: only plain rows' teams may split)
  const RowInput<T, F, KL, kSplits> early =
      early_row_input<T, F, KL, W, kSplits>(in, plan.from_row_zero, plan.fused, io, w.out.data_lanes);
  const float global_scale = global_scale_ptr ? *global_scale_ptr : 0.f;
  constexpr bool own = kOwn;
  TokenShape s = quant_token_shape(lc, tp, plan.reduce, counted<kOwn>(io, g.me / tp), w.wire_units);
  if (own) s.rc.hash = kOwnCountsHash;
  check_buffers(lc.cx, s.rc.count(s.d) > io.in_rows || s.rc.offset[s.dp] > io.out_rows);
  // The algorithm field holds the Lamport slot, so the quantized gathers' fields go in the
  // width's high byte (row bytes are below 2^16).
  const uint64_t width = (uint64_t)io.row_lanes * 8 | (uint64_t)quant_fields<F>(plan.fused, plan.replicated) << 24;
  arrive(lc.cx, make_fingerprint(op, Lane<T>::kDType, lc.algorithm(), s.variant(partial), s.rc.hash, width));
  if (own) publish_own_count(lc.cx, io, s.rc, s.d);
  stage_my_rows<T, F, KL, W, kSplits>(lc.cx, s, plan, in, residual, weight, residual_out, eps, global_scale, io,
                                      w.out.data_lanes, early, row, warp_buf, own,
                                      [&] { if (own) learn_counts(lc.cx, io, tp, s.rc); },
                                      [&](int64_t r, const QuantizedLanes<KL>& q, bool owned, int to) {
                                        put_quantized_row<F, KL, W>(lc, s, plan.replicated, r, owned, q, to, w);
                                      });
  HC_TRACE_EVENT(kTraceSent);
  refill_previous_slot(lc);
  HC_TRACE_EVENT(kTraceRefilled);
  // Phase 1: the units of the rows other ranks own (replicated: of other DP groups).
  for_each_foreign_item(s, g.me, plan.replicated, w.wire_units,
                        [&](int64_t o, int64_t u, int owner, int64_t, int64_t c) {
    const int64_t i = c * w.wire_units + u;  // the owner's area rows start at its chunk's first row
    uint4 data[1];  // one source (call.cuh wait_all: why not kMaxRanks)
    wait_units(lc, 1, owner, i, [](int) { return true; }, data);
    w.store(o, u, u < w.data_units ? wire_swap<F>(data[0], false) : data[0]);
  });
  end_lamport_call(lc, area_rows(s.rc, tp) * w.wire_units);
}

}  // namespace hc

using namespace hc;

// The arguments of hc_quant_gather (quant_gather.cu) with the group's Lamport areas (l);
// algorithm kQuantGatherLocal runs lamport_quant_local.cu's kernel.
extern "C" int hc_lamport_quant_gather(const GroupArgs* g, const LamportArgs* l, int algorithm, int format, int dtype,
                                       int tp, int partial, int op, const void* in, const void* residual,
                                       const void* weight, void* residual_out, float eps, const float* global_scale,
                                       void* out_data, void* out_scales, const int32_t* sizes_device,
                                       const int32_t* sizes_host, const int32_t* own_count, int64_t hidden,
                                       int64_t in_rows, int64_t out_rows, int pdl, cudaStream_t stream) {
  if (!quant_args_valid(g, algorithm, format, tp, hidden, global_scale, sizes_device, own_count))
    return (int)cudaErrorInvalidValue;
  if (algorithm == kQuantGatherLocal) {  // partial rows; fused with one DP group (lamport_quant_local.cu)
    if (!partial || op != kGatherTokens) return (int)cudaErrorInvalidValue;
    return launch_lamport_quant_local(g, l, format, dtype, tp, in, residual, weight, residual_out, eps, global_scale,
                                      out_data, out_scales, sizes_device, sizes_host, own_count, hidden, in_rows,
                                      out_rows, pdl, stream);
  }
  int status = 0;
  HC_DISPATCH_DTYPE(dtype, HC_DISPATCH_QUANT(format, {
    const RowsArg io = rows_arg(sizes_device, sizes_host, g->nranks / tp, hidden * sizeof(Elem), in_rows, out_rows,
                                own_count);
    const WireUnits w = wire_units<Fmt>(hidden, out_data, out_scales, out_rows);
    const int mode = row_mode(weight != nullptr, partial, tp);
    const RowPlan plan = row_plan(mode, algorithm, tp, partial);
    const Grid grid = quant_grid(io, *g, tp, plan, splits_rows<Fmt>(mode, io.row_lanes), w.wire_units);
    // Narrow row teams for plain rows (team_threads).
    status = with_kernel_instance<Fmt, true>(w.out.data_lanes, mode, own_count != nullptr,
                                       [&](auto kl, auto team, auto m, auto own) {
      const auto kernel = lamport_quant_gather<Elem, Fmt, decltype(kl)::value, decltype(team)::value,
                                               decltype(m)::value, decltype(own)::value>;
      return launch_kernel_smem(kernel, grid.blocks, grid.threads, quant_staging_bytes(hidden), stream, pdl, *g, *l,
                                op, algorithm, tp, partial, (const uint2*)in, (const uint2*)residual,
                                (const uint2*)weight, (uint2*)residual_out, eps, global_scale, w, io);
    });
  }));
  return status;
}
