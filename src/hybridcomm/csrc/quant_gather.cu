// Quantized gathers: gather_tokens (optionally fused with residual add + RMSNorm) and
// all_gather_v whose rows travel quantized (fp8, fp8_block128, nvfp4; quant.cuh and
// docs/quantization.md).
//
// The group has `tp` ranks per DP group (d = me / tp; all_gather_v runs with tp = 1, one
// member per "group"). Each row has exactly one owner, the tp rank whose chunk holds it
// (arguments.split_evenly); the owner quantizes the row and pushes its wire row -- data lanes,
// then scale lanes, 8 bytes each -- to every other rank.
//
//   phase 0 (partial rows, tp > 1): lanes of a row go to its owner (fused: to every tp peer,
//           as all of them write the residual output); the owner sums them in tp order.
//   per row (one block): fp32 values rounded once to T (after the fused add + RMSNorm, in
//           gather_tokens.cu's order), staged in shared memory; the owner quantizes, pushes.
//   phase 1: every rank copies the wire rows it does not own into data / scales.
//
// Device-side counts, capacity checks and bounded waits as in gather_tokens.cu.
#include "block_reduce.cuh"
#include "launch.cuh"
#include "quant.cuh"

namespace hc {

// Where a quantized row goes: 8-byte wire lanes, data first, then the scale bytes.
struct WireRows {
  int64_t data_lanes, scale_bytes, wire_lanes, out_rows;
  uint2* __restrict__ data;        // out_rows x data_lanes lanes
  uint8_t* __restrict__ scales;    // out_rows x scale_bytes

  // Wire lane l of output row o into data / scales.
  __device__ __forceinline__ void store(int64_t o, int64_t l, uint2 v) const {
    if (o >= out_rows) return;
    if (l < data_lanes) {
      data[o * data_lanes + l] = v;
      return;
    }
    const int64_t b = (l - data_lanes) * 8;
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(&v);
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (b + k < scale_bytes) scales[o * scale_bytes + b + k] = bytes[k];
  }
};

template <int F>
__host__ __device__ __forceinline__ WireRows wire_rows(int64_t hidden, void* data, void* scales, int64_t out_rows) {
  const int64_t data_lanes = hidden / QuantTraits<F>::kPerLane;
  const int64_t scale_bytes = (QuantTraits<F>::kBlock ? hidden / QuantTraits<F>::kBlock : 1) * QuantTraits<F>::kScaleBytes;
  return WireRows{data_lanes, scale_bytes, data_lanes + (scale_bytes + 7) / 8, out_rows, (uint2*)data, (uint8_t*)scales};
}

__device__ __forceinline__ int owner_of(const TokenShape& s, int d, int64_t j) {
  return d * s.tp + chunk_owner(j, s.rc.count[d], s.tp);
}

__device__ __forceinline__ int group_of_row(const TokenShape& s, int64_t o) {
  int d = 0;
  while (d + 1 < s.dp && s.rc.offset[d + 1] <= o) ++d;
  return d;
}

// Data lane l of a staged row, quantized; block formats also write their block's scale to
// the staged scale bytes (fp8 per token: `row_scale` is the row's). Whole warps call this
// (fp8_block128 shuffles); lanes beyond the row pass active = false.
template <int F>
__device__ __forceinline__ uint2 quantize_lane(const float* row, int64_t l, bool active, float global_scale,
                                               Fp8Scale row_scale, uint8_t* scale_bytes) {
  constexpr int N = QuantTraits<F>::kPerLane;
  float v[N];
  float amax = 0.f;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    v[k] = active ? row[l * N + k] : 0.f;
    amax = fmaxf(amax, fabsf(v[k]));
  }
  uint32_t w[2] = {0u, 0u};
  if constexpr (F == kQuantNvfp4) {
    const Nvfp4Scale sc = nvfp4_scale(amax, global_scale);  // a lane is exactly one 16-block
    if (active) scale_bytes[l] = sc.sf;
#pragma unroll
    for (int k = 0; k < N; ++k) w[k / 8] |= nvfp4_code(v[k], sc.inv) << (4 * (k % 8));
  } else {
    Fp8Scale sc = row_scale;
    if constexpr (F == kQuantFp8Block128) {
      // 16 lanes per block, held by 16 consecutive threads of one warp in the same iteration.
      sc = fp8_scale(group_max(amax, 16));
      if (active && l % 16 == 0) *reinterpret_cast<float*>(scale_bytes + (l / 16) * 4) = sc.scale;
    }
#pragma unroll
    for (int k = 0; k < N; ++k) w[k / 4] |= (uint32_t)fp8_code(v[k], sc.inv) << (8 * (k % 4));
  }
  return make_uint2(w[0], w[1]);
}

// Scale lane l (counted from the first scale lane) of the staged scale bytes.
__device__ __forceinline__ uint2 scale_lane(const uint8_t* scale_bytes, int64_t l, int64_t nbytes) {
  uint2 v = make_uint2(0, 0);
  uint8_t* b = reinterpret_cast<uint8_t*>(&v);
#pragma unroll
  for (int k = 0; k < 8; ++k)
    if (l * 8 + k < nbytes) b[k] = scale_bytes[l * 8 + k];
  return v;
}

// Row r of my group into `row` (fp32, staged): summed over tp (reduce), plus the residual and
// RMSNorm when fused (residual_out written), rounded to T as the reference's result is.
template <typename T>
__device__ __forceinline__ void stage_row(const CallCtx& cx, const TokenShape& s, bool reduce, int64_t r,
                                          const uint2* __restrict__ in, const uint2* __restrict__ residual,
                                          const uint2* __restrict__ weight, uint2* __restrict__ residual_out,
                                          float eps, const RowsArg& io, float* row, float* warp_buf) {
  constexpr int kN = Lane<T>::kN;
  const bool in_bounds = r < io.in_rows, fused = weight != nullptr;
  float sumsq = 0.f;
  for (int64_t l = threadIdx.x; l < s.row_lanes; l += blockDim.x) {
    const int64_t i = r * s.row_lanes + l;
    const uint2 local = in_bounds ? in[i] : make_uint2(0, 0);
    float acc[4];
    if (reduce) sum_sources<T>(cx, 0, s.tp, s.t, s.d * s.tp, i, local, acc);
    else Lane<T>::unpack(local, acc);
    if (fused) {  // the residual joins the fp32 sum before its single rounding (norm.py)
      float res[4];
      Lane<T>::unpack(in_bounds ? residual[i] : make_uint2(0, 0), res);
#pragma unroll
      for (int k = 0; k < kN; ++k) acc[k] += res[k];
    }
    const uint2 packed = Lane<T>::pack(acc);
    if (fused && in_bounds) residual_out[i] = packed;
    Lane<T>::unpack(packed, acc);
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      sumsq += acc[k] * acc[k];
      row[l * kN + k] = acc[k];
    }
  }
  if (!fused) return;
  // RMSNorm as gather_fused computes it (same operations, same order: the same bits).
  const float inv_hidden = 1.0f / (float)(s.row_lanes * kN);
  const float scale = 1.0f / sqrtf(block_sum(sumsq, warp_buf) * inv_hidden + eps);
  for (int64_t l = threadIdx.x; l < s.row_lanes; l += blockDim.x) {
    float v[4], w[4];
#pragma unroll
    for (int k = 0; k < kN; ++k) v[k] = row[l * kN + k];
    Lane<T>::unpack(weight[l], w);
#pragma unroll
    for (int k = 0; k < kN; ++k) v[k] = v[k] * scale * w[k];
    Lane<T>::unpack(Lane<T>::pack(v), v);
#pragma unroll
    for (int k = 0; k < kN; ++k) row[l * kN + k] = v[k];
  }
}

// The staged row r quantized: into my output and to every other rank (area 1, at the row's
// group-local wire lanes).
template <int F>
__device__ __forceinline__ void push_quantized_row(const CallCtx& cx, const TokenShape& s, int64_t r,
                                                   const float* row, uint8_t* scale_bytes, float global_scale,
                                                   const WireRows& w, float* warp_buf) {
  __syncthreads();  // the staged row is complete
  Fp8Scale row_scale{0.f, 0.f};
  if constexpr (F == kQuantFp8) {
    float amax = 0.f;
    for (int64_t e = threadIdx.x; e < w.data_lanes * 8; e += blockDim.x) amax = fmaxf(amax, fabsf(row[e]));
    row_scale = fp8_scale(block_max(amax, warp_buf));
    if (threadIdx.x == 0) *reinterpret_cast<float*>(scale_bytes) = row_scale.scale;
  }
  const int64_t o = s.rc.offset[s.d] + r, base = r * w.wire_lanes;
  const int64_t warp_lanes = (w.data_lanes + 31) / 32 * 32;  // whole warps (see quantize_lane)
  for (int64_t l = threadIdx.x; l < warp_lanes; l += blockDim.x) {
    const bool active = l < w.data_lanes;
    const uint2 v = quantize_lane<F>(row, l, active, global_scale, row_scale, scale_bytes);
    if (!active) continue;
    w.store(o, l, v);
    push_to_peers(cx, cx.everyone(), 1, base + l, v);
  }
  __syncthreads();  // the staged scale bytes are complete
  for (int64_t l = w.data_lanes + threadIdx.x; l < w.wire_lanes; l += blockDim.x) {
    const uint2 v = scale_lane(scale_bytes, l - w.data_lanes, w.scale_bytes);
    w.store(o, l, v);
    push_to_peers(cx, cx.everyone(), 1, base + l, v);
  }
  __syncthreads();  // the staged row is reused by the next row
}

template <typename T, int F>
__global__ void __launch_bounds__(kThreads)
    quant_gather(GroupArgs g, int op, int tp, int partial, const uint2* __restrict__ in,
                 const uint2* __restrict__ residual, const uint2* __restrict__ weight,
                 uint2* __restrict__ residual_out, float eps, const float* __restrict__ global_scale_ptr,
                 WireRows w, RowsArg io) {
  extern __shared__ float4 staged_[];  // the row's fp32 values, then its scale bytes
  float* row = reinterpret_cast<float*>(staged_);
  uint8_t* scale_bytes = reinterpret_cast<uint8_t*>(row + io.row_lanes * Lane<T>::kN);
  __shared__ float warp_buf[kThreads / 32];

  CallCtx cx = begin_call(g, op);
  // Areas hold the larger of a partial input row (phase 0) and a wire row (phase 1).
  TokenShape s = token_shape(cx, tp, io.sizes, io.row_lanes > w.wire_lanes ? io.row_lanes : w.wire_lanes);
  s.row_lanes = io.row_lanes;
  check_buffers(cx, s.rc.count[s.d] > io.in_rows || s.rc.offset[s.dp] > io.out_rows);
  // Fused iff a norm weight is given (never empty; an empty residual of a rank with no rows has a
  // null pointer, so it cannot tell).
  const bool fused = weight != nullptr, reduce = partial && tp > 1;
  // Peers must agree on the format and the fusion too: both go in the algorithm field.
  arrive(cx, make_fingerprint(op, Lane<T>::kDType, F | (fused ? 4 : 0), s.variant(partial), s.rc.hash,
                              (uint64_t)io.row_lanes * 8));
  const int64_t rows = s.rc.count[s.d], in_lanes = io.in_lanes();
  const float global_scale = global_scale_ptr ? *global_scale_ptr : 0.f;

  // Phase 0: partial lanes to the rank(s) that sum them.
  if (reduce) {
    for (int64_t i = grid_thread(); i < rows * s.row_lanes; i += grid_threads()) {
      const uint2 v = i < in_lanes ? in[i] : make_uint2(0, 0);
      const int owner = owner_of(s, s.d, i / s.row_lanes);
      s.tp_group().for_each_other([&](int peer) {
        if (fused || peer == owner) put_lane(cx, peer, 0, i, v);
      });
    }
  }
  // One block per row: every row of my group when fused (the residual output), else my chunk.
  const int64_t first = fused ? 0 : chunk_begin(rows, s.t, tp), last = fused ? rows : chunk_begin(rows, s.t + 1, tp);
  for (int64_t r = first + blockIdx.x; r < last; r += gridDim.x) {
    stage_row<T>(cx, s, reduce, r, in, residual, weight, residual_out, eps, io, row, warp_buf);
    if (chunk_owner(r, rows, tp) == s.t) {  // uniform over the block
      push_quantized_row<F>(cx, s, r, row, scale_bytes, global_scale, w, warp_buf);
    }
  }
  // Phase 1: the rows other ranks own.
  const int64_t total = s.rc.offset[s.dp] * w.wire_lanes;
  for (int64_t x = grid_thread(); x < total; x += grid_threads()) {
    const int64_t o = x / w.wire_lanes, l = x % w.wire_lanes;
    const int d = group_of_row(s, o);
    const int64_t j = o - s.rc.offset[d];
    const int owner = owner_of(s, d, j);
    if (owner != g.me) w.store(o, l, wait_lane(cx, 1, owner, j * w.wire_lanes + l));
  }
  end_call(cx);
}

}  // namespace hc

using namespace hc;

#define HC_DISPATCH_QUANT(FMT, ...)              \
  switch (FMT) {                                 \
    case hc::kQuantFp8: {                        \
      constexpr int Fmt = hc::kQuantFp8;         \
      __VA_ARGS__;                               \
      break;                                     \
    }                                            \
    case hc::kQuantFp8Block128: {                \
      constexpr int Fmt = hc::kQuantFp8Block128; \
      __VA_ARGS__;                               \
      break;                                     \
    }                                            \
    case hc::kQuantNvfp4: {                      \
      constexpr int Fmt = hc::kQuantNvfp4;       \
      __VA_ARGS__;                               \
      break;                                     \
    }                                            \
    default:                                     \
      return (int)cudaErrorInvalidValue;         \
  }

// format: a QuantFormat; op: the Op code errors are reported under (kGatherTokens, kAllGatherV).
// residual / weight / residual_out: the fused add + RMSNorm (null: not fused). global_scale:
// device fp32 (nvfp4; null otherwise). out_data: out_rows x data bytes; out_scales: out_rows x
// scale bytes (hybridcomm.quant.formats). hidden: a multiple of 16, at most kMaxQuantHidden;
// in_rows / out_rows: rows the buffers hold (capacity). pdl: launch overlapping the previous
// kernel (pdl.cuh; the kernel touches no memory before begin_call's wait).
extern "C" int hc_quant_gather(const GroupArgs* g, int format, int dtype, int tp, int partial, int op,
                               const void* in, const void* residual, const void* weight, void* residual_out,
                               float eps, const float* global_scale, void* out_data, void* out_scales,
                               const int32_t* sizes_device, const int32_t* sizes_host, int64_t hidden,
                               int64_t in_rows, int64_t out_rows, int pdl, cudaStream_t stream) {
  if (hidden % 16 || hidden <= 0 || hidden > kMaxQuantHidden || tp < 1 || g->nranks % tp ||
      (format == kQuantNvfp4 && !global_scale))
    return (int)cudaErrorInvalidValue;
  const size_t smem = (size_t)hidden * sizeof(float) + (size_t)hidden / 4 + 16;  // row + scale bytes
  int status = 0;
  HC_DISPATCH_DTYPE(dtype, HC_DISPATCH_QUANT(format, {
    const RowsArg io = rows_arg(sizes_device, sizes_host, g->nranks / tp, hidden * sizeof(Elem), in_rows, out_rows);
    const WireRows w = wire_rows<Fmt>(hidden, out_data, out_scales, out_rows);
    const int blocks = blocks_for(out_rows * w.wire_lanes, *g);
    status = launch_kernel_smem(quant_gather<Elem, Fmt>, blocks, kThreads, smem, stream, pdl, *g, op, tp, partial,
                                (const uint2*)in, (const uint2*)residual, (const uint2*)weight,
                                (uint2*)residual_out, eps, global_scale, w, io);
  }));
  return status;
}
