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
//           (fused: to every tp peer), in LL area 0.
//   per row (one block): staged, quantized two lanes (one unit) per thread; my copy stored,
//           the units put to every peer.
//   phase 1: every rank waits for the units of the rows it does not own and stores them.
//
// Reserved pattern (docs/quantization.md): no wire word may be the sentinel 0xFFFFFFFF. fp8
// data bytes are never 0xFF (e4m3 NaN is 0x7f), fp32 and e4m3 scales are never negative, pads
// are zero; nvfp4 data words can be 0xFFFFFFFF (eight -6.0s), so they travel as 0x88888888
// (eight -0 codes, which the quantizer never writes: zero is always code 0) and are swapped
// back on receipt.
#include "lamport.cuh"
#include "quant_rows.cuh"

namespace hc {

constexpr uint32_t kNvfp4WireStandIn = 0x88888888u;  // stands in for 0xFFFFFFFF on the wire

__device__ __forceinline__ uint32_t swap_word(uint32_t w, uint32_t a, uint32_t b) { return w == a ? b : w; }

// A data unit as it travels (nvfp4: the sentinel word replaced by its stand-in) and back.
template <int F>
__device__ __forceinline__ uint4 data_to_wire(uint4 v) {
  if constexpr (F != kQuantNvfp4) return v;
  const uint32_t s = kSentinelWord, r = kNvfp4WireStandIn;
  return make_uint4(swap_word(v.x, s, r), swap_word(v.y, s, r), swap_word(v.z, s, r), swap_word(v.w, s, r));
}

template <int F>
__device__ __forceinline__ uint4 data_from_wire(uint4 v) {
  if constexpr (F != kQuantNvfp4) return v;
  const uint32_t s = kSentinelWord, r = kNvfp4WireStandIn;
  return make_uint4(swap_word(v.x, r, s), swap_word(v.y, r, s), swap_word(v.z, r, s), swap_word(v.w, r, s));
}

// Where a quantized row goes, in 16-byte units: data units first, then scale units.
struct WireUnits {
  int64_t data_lanes, scale_bytes, data_units, wire_units, out_rows;
  uint2* __restrict__ data;      // out_rows x data_lanes lanes
  uint8_t* __restrict__ scales;  // out_rows x scale_bytes

  // Unit u of output row o into data / scales (pads dropped).
  __device__ __forceinline__ void store(int64_t o, int64_t u, uint4 v) const {
    if (o >= out_rows) return;
    if (u < data_units) {
      const int64_t l = 2 * u;
      data[o * data_lanes + l] = make_uint2(v.x, v.y);
      if (l + 1 < data_lanes) data[o * data_lanes + l + 1] = make_uint2(v.z, v.w);
      return;
    }
    const int64_t b = (u - data_units) * 16;
    if (scale_bytes % 4 == 0) {  // every format but nvfp4 of hidden / 16 not a multiple of 4: words
      const uint32_t words[4] = {v.x, v.y, v.z, v.w};
      uint32_t* dst = reinterpret_cast<uint32_t*>(scales + o * scale_bytes + b);
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (b + 4 * k < scale_bytes) dst[k] = words[k];
      return;
    }
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(&v);
#pragma unroll
    for (int k = 0; k < 16; ++k)
      if (b + k < scale_bytes) scales[o * scale_bytes + b + k] = bytes[k];
  }
};

template <int F>
__host__ __device__ __forceinline__ WireUnits wire_units(int64_t hidden, void* data, void* scales, int64_t out_rows) {
  const int64_t data_lanes = QuantRowShape<F>::data_lanes(hidden), scale_bytes = QuantRowShape<F>::scale_bytes(hidden);
  const int64_t data_units = (data_lanes + 1) / 2;
  return WireUnits{data_lanes, scale_bytes, data_units, data_units + (scale_bytes + 15) / 16, out_rows,
                   (uint2*)data, (uint8_t*)scales};
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

// The staged row r quantized: into my output and, as units, into every peer's area from me.
template <int F>
__device__ __forceinline__ void put_quantized_row(const LamportCall& lc, const TokenShape& s, int64_t r,
                                                  const float* row, uint8_t* scale_bytes, float global_scale,
                                                  const WireUnits& w, float* warp_buf) {
  __syncthreads();  // the staged row is complete
  const Fp8Scale row_scale = row_fp8_scale<F>(row, w.data_lanes * 8, scale_bytes, warp_buf);
  const int64_t o = s.rc.offset[s.d] + r;
  const int64_t base = (r - chunk_begin(s.rc.count(s.d), s.t, s.tp)) * w.wire_units;
  const auto put = [&](int64_t u, uint4 wire) {
    lc.cx.everyone().for_each_other([&](int peer) { put_unit(lc.outbox(peer) + base + u, wire); });
  };
  const int64_t warp_units = (w.data_units + 31) / 32 * 32;  // whole warps (see quantize_lanes)
  for (int64_t u = threadIdx.x; u < warp_units; u += blockDim.x) {
    uint2 v[2];
    quantize_lanes<F, 2>(row, 2 * u, w.data_lanes, global_scale, row_scale, scale_bytes, v);
    if (u >= w.data_units) continue;
    const uint4 unit = make_uint4(v[0].x, v[0].y, v[1].x, v[1].y);
    w.store(o, u, unit);
    put(u, data_to_wire<F>(unit));
  }
  __syncthreads();  // the staged scale bytes are complete
  for (int64_t u = w.data_units + threadIdx.x; u < w.wire_units; u += blockDim.x) {
    const int64_t l = 2 * (u - w.data_units);
    const uint2 a = scale_lane(scale_bytes, l, w.scale_bytes), b = scale_lane(scale_bytes, l + 1, w.scale_bytes);
    const uint4 unit = make_uint4(a.x, a.y, b.x, b.y);
    w.store(o, u, unit);
    put(u, unit);
  }
  __syncthreads();  // the staged row is reused by the next row
}

template <typename T, int F>
__global__ void __launch_bounds__(kThreads)
    lamport_quant_gather(GroupArgs g, const __grid_constant__ LamportArgs l, int op, int tp, int partial,
                         const uint2* __restrict__ in, const uint2* __restrict__ residual,
                         const uint2* __restrict__ weight, uint2* __restrict__ residual_out, float eps,
                         const float* __restrict__ global_scale_ptr, WireUnits w, RowsArg io) {
  extern __shared__ float4 staged_[];  // the row's fp32 values, then its scale bytes
  float* row = reinterpret_cast<float*>(staged_);
  uint8_t* scale_bytes = reinterpret_cast<uint8_t*>(row + io.row_lanes * Lane<T>::kN);
  __shared__ float warp_buf[kThreads / 32];

  LamportCall lc = begin_lamport_call(g, l, op);
  const bool fused = weight != nullptr, reduce = partial && tp > 1;  // (quant_gather.cu: why the weight)
  const TokenShape s = quant_token_shape(lc, tp, reduce, io, w.wire_units);
  check_buffers(lc.cx, s.rc.count(s.d) > io.in_rows || s.rc.offset[s.dp] > io.out_rows);
  // The algorithm field holds the Lamport slot, so the format and the fusion go in the width's
  // high byte (row bytes are below 2^16).
  arrive(lc.cx, make_fingerprint(op, Lane<T>::kDType, lc.algorithm(), s.variant(partial), s.rc.hash,
                                 (uint64_t)io.row_lanes * 8 | (uint64_t)quant_fields<F>(fused) << 24));
  const int64_t rows = s.rc.count(s.d);
  const float global_scale = global_scale_ptr ? *global_scale_ptr : 0.f;

  if (reduce) send_partial_lanes(lc.cx, s, fused, in, io.in_lanes());
  int64_t first, last;
  staged_rows(s, fused, first, last);
  for (int64_t r = first + blockIdx.x; r < last; r += gridDim.x) {
    stage_row<T>(lc.cx, s, reduce, r, in, residual, weight, residual_out, eps, io, row, warp_buf);
    if (chunk_owner(r, rows, tp) == s.t) {  // uniform over the block
      put_quantized_row<F>(lc, s, r, row, scale_bytes, global_scale, w, warp_buf);
    }
  }
  refill_previous_slot(lc);
  // Phase 1: the rows other ranks own.
  const int64_t total = s.rc.offset[s.dp] * w.wire_units;
  for (int64_t x = grid_thread(); x < total; x += grid_threads()) {
    const int64_t o = x / w.wire_units, u = x % w.wire_units;
    const int d = group_of_row(s, o);
    const int64_t j = o - s.rc.offset[d];
    const int owner = owner_of(s, d, j);
    if (owner == g.me) continue;
    const int64_t i = (j - chunk_begin(s.rc.count(d), owner % tp, tp)) * w.wire_units + u;
    uint4 data[kMaxRanks];
    wait_units(lc, 1, owner, i, [](int) { return true; }, data);
    w.store(o, u, u < w.data_units ? data_from_wire<F>(data[0]) : data[0]);
  }
  end_lamport_call(lc, area_rows(s.rc, tp) * w.wire_units);
}

}  // namespace hc

using namespace hc;

// The arguments of hc_quant_gather (quant_gather.cu) with the group's Lamport areas (l).
extern "C" int hc_lamport_quant_gather(const GroupArgs* g, const LamportArgs* l, int format, int dtype, int tp,
                                       int partial, int op, const void* in, const void* residual, const void* weight,
                                       void* residual_out, float eps, const float* global_scale, void* out_data,
                                       void* out_scales, const int32_t* sizes_device, const int32_t* sizes_host,
                                       int64_t hidden, int64_t in_rows, int64_t out_rows, int pdl,
                                       cudaStream_t stream) {
  if (!quant_args_valid(g, format, tp, hidden, global_scale)) return (int)cudaErrorInvalidValue;
  int status = 0;
  HC_DISPATCH_DTYPE(dtype, HC_DISPATCH_QUANT(format, {
    const RowsArg io = rows_arg(sizes_device, sizes_host, g->nranks / tp, hidden * sizeof(Elem), in_rows, out_rows);
    const WireUnits w = wire_units<Fmt>(hidden, out_data, out_scales, out_rows);
    const int blocks = blocks_for(out_rows * w.wire_units, *g);
    status = launch_kernel_smem(lamport_quant_gather<Elem, Fmt>, blocks, kThreads, quant_staging_bytes(hidden),
                                stream, pdl, *g, *l, op, tp, partial, (const uint2*)in, (const uint2*)residual,
                                (const uint2*)weight, (uint2*)residual_out, eps, global_scale, w, io);
  }));
  return status;
}
