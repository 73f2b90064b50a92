// The quantized gathers' row work, shared by their LL kernel (quant_gather.cu) and their
// Lamport kernel (lamport_quant_gather.cu): who owns a row, staging a row (the reduction over
// attention TP, the fused add + RMSNorm) and quantizing it into 8-byte wire lanes. The two
// kernels differ only in how the quantized lanes travel.
//
// Ownership: the group has `tp` ranks per DP group (d = me / tp; all_gather_v runs with tp = 1,
// one member per "group"). Each row has exactly one owner, the tp rank whose chunk holds it
// (arguments.split_evenly); the owner quantizes the row and sends it to every other rank.
#pragma once

#include "block_reduce.cuh"
#include "launch.cuh"
#include "quant.cuh"

namespace hc {

// Where quantized rows land: out_rows rows of data (8-byte lanes) and of scale bytes. Both
// kernels' wire rows are the data lanes, then the scale bytes, padded.
struct QuantOut {
  int64_t data_lanes, scale_bytes, out_rows;
  uint2* __restrict__ data;      // out_rows x data_lanes lanes
  uint8_t* __restrict__ scales;  // out_rows x scale_bytes

  // Scale bytes [b, b + N) of row o (< out_rows) from v's bytes; those past the row's are padding.
  template <typename V>
  __device__ __forceinline__ void store_scales(int64_t o, int64_t b, const V& v) const {
    constexpr int N = (int)sizeof(V);
    if (scale_bytes % 4 == 0) {  // all but nvfp4 rows of hidden / 16 not a multiple of 4: words
      const uint32_t* words = reinterpret_cast<const uint32_t*>(&v);
      uint32_t* dst = reinterpret_cast<uint32_t*>(scales + o * scale_bytes + b);
#pragma unroll
      for (int k = 0; k < N / 4; ++k)
        if (b + 4 * k < scale_bytes) dst[k] = words[k];
      return;
    }
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(&v);
#pragma unroll
    for (int k = 0; k < N; ++k)
      if (b + k < scale_bytes) scales[o * scale_bytes + b + k] = bytes[k];
  }
};

template <int F>
__host__ __device__ __forceinline__ QuantOut quant_out(int64_t hidden, void* data, void* scales, int64_t out_rows) {
  const int64_t scale_bytes = (QuantTraits<F>::kBlock ? hidden / QuantTraits<F>::kBlock : 1) * QuantTraits<F>::kScaleBytes;
  return QuantOut{hidden / QuantTraits<F>::kPerLane, scale_bytes, out_rows, (uint2*)data, (uint8_t*)scales};
}

__device__ __forceinline__ int owner_of(const TokenShape& s, int d, int64_t j) {
  return d * s.tp + chunk_owner(j, s.rc.count(d), s.tp);
}

__device__ __forceinline__ int group_of_row(const TokenShape& s, int64_t o) { return s.rc.holder(o, s.dp, 1); }

// Data lanes l0 .. l0 + K - 1 of a staged row, quantized into out (zeros for lanes at or past
// data_lanes); block formats also write their blocks' scales to the staged scale bytes (fp8 per
// token: `row_scale` is the row's). Whole warps call this (fp8_block128 shuffles: a block is 16
// lanes, held by 16 / K consecutive threads in the same iteration).
template <int F, int K>
__device__ __forceinline__ void quantize_lanes(const float* row, int64_t l0, int64_t data_lanes, float global_scale,
                                               Fp8Scale row_scale, uint8_t* scale_bytes, uint2 (&out)[K]) {
  constexpr int N = QuantTraits<F>::kPerLane;
  float v[K][N];
  float amax[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const bool active = l0 + k < data_lanes;
    amax[k] = 0.f;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      v[k][e] = active ? row[(l0 + k) * N + e] : 0.f;
      amax[k] = fmaxf(amax[k], fabsf(v[k][e]));
    }
  }
  if constexpr (F == kQuantNvfp4) {
#pragma unroll
    for (int k = 0; k < K; ++k) {  // a lane is exactly one 16-block
      const Nvfp4Scale sc = nvfp4_scale(amax[k], global_scale);
      if (l0 + k < data_lanes) scale_bytes[l0 + k] = sc.sf;
      uint32_t w[2] = {0u, 0u};
#pragma unroll
      for (int e = 0; e < N; ++e) w[e / 8] |= nvfp4_code(v[k][e], sc.inv) << (4 * (e % 8));
      out[k] = make_uint2(w[0], w[1]);
    }
  } else {
    Fp8Scale sc = row_scale;
    if constexpr (F == kQuantFp8Block128) {
      float a = amax[0];
#pragma unroll
      for (int k = 1; k < K; ++k) a = fmaxf(a, amax[k]);
      sc = fp8_scale(group_max(a, 16 / K));
      if (l0 < data_lanes && l0 % 16 == 0) *reinterpret_cast<float*>(scale_bytes + (l0 / 16) * 4) = sc.scale;
    }
#pragma unroll
    for (int k = 0; k < K; ++k) {
      uint32_t w[2] = {0u, 0u};
#pragma unroll
      for (int e = 0; e < N; ++e) w[e / 4] |= (uint32_t)fp8_code(v[k][e], sc.inv) << (8 * (e % 4));
      out[k] = make_uint2(w[0], w[1]);
    }
  }
}

// fp8 (one scale per token): the staged row's scale, also written to the staged scale bytes;
// other formats: unused. Every thread of the block calls it (a block reduction).
template <int F>
__device__ __forceinline__ Fp8Scale row_fp8_scale(const float* row, int64_t elements, uint8_t* scale_bytes,
                                                  float* warp_buf) {
  Fp8Scale row_scale{0.f, 0.f};
  if constexpr (F == kQuantFp8) {
    float amax = 0.f;
    for (int64_t e = threadIdx.x; e < elements; e += blockDim.x) amax = fmaxf(amax, fabsf(row[e]));
    row_scale = fp8_scale(block_max(amax, warp_buf));
    if (threadIdx.x == 0) *reinterpret_cast<float*>(scale_bytes) = row_scale.scale;
  }
  return row_scale;
}

// Scale lane l (counted from the first scale lane) of the staged scale bytes; zeros past nbytes.
__device__ __forceinline__ uint2 scale_lane(const uint8_t* scale_bytes, int64_t l, int64_t nbytes) {
  uint2 v = make_uint2(0, 0);
  uint8_t* b = reinterpret_cast<uint8_t*>(&v);
#pragma unroll
  for (int k = 0; k < 8; ++k)
    if (l * 8 + k < nbytes) b[k] = scale_bytes[l * 8 + k];
  return v;
}

// The staged row (complete once every thread arrives here) quantized, K lanes an item: emit(i, v)
// with v the item's K lanes, first the data items (i < ceil(data_lanes / K); data lanes K*i ..),
// then the scale items (the staged scale bytes, 8K a item, zeros past nscale_bytes), numbered on
// from the data items. The kernels' emit stores the item and sends it. Every thread calls this.
template <int F, int K, typename Emit>
__device__ __forceinline__ void quantize_row(const float* row, uint8_t* scale_bytes, int64_t data_lanes,
                                             int64_t nscale_bytes, float global_scale, float* warp_buf, Emit emit) {
  __syncthreads();  // the staged row is complete
  const Fp8Scale row_scale = row_fp8_scale<F>(row, data_lanes * 8, scale_bytes, warp_buf);
  const int64_t data_items = (data_lanes + K - 1) / K;
  const int64_t warp_items = (data_items + 31) / 32 * 32;  // whole warps (see quantize_lanes)
  for (int64_t i = threadIdx.x; i < warp_items; i += blockDim.x) {
    uint2 v[K];
    quantize_lanes<F, K>(row, K * i, data_lanes, global_scale, row_scale, scale_bytes, v);
    if (i < data_items) emit(i, v);
  }
  __syncthreads();  // the staged scale bytes are complete
  const int64_t scale_items = (nscale_bytes + 8 * K - 1) / (8 * K);
  for (int64_t i = threadIdx.x; i < scale_items; i += blockDim.x) {
    uint2 v[K];
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = scale_lane(scale_bytes, K * i + k, nscale_bytes);
    emit(data_items + i, v);
  }
  __syncthreads();  // the staged row is reused by the next row
}

// This thread's first lane of its block's first row, loaded early: right after the PDL wait,
// before the counts and arrive(), so its latency overlaps theirs (as rows.cuh EarlyInput). Only
// where that row is known without the counts, tp == 1 (a block stages rows blockIdx.x,
// blockIdx.x + gridDim.x, ...: stage_my_rows); elsewhere unused (zero).
__device__ __forceinline__ uint2 early_lane(const uint2* __restrict__ in, const RowsArg& io, int tp) {
  const int64_t i = (int64_t)blockIdx.x * io.row_lanes + threadIdx.x;
  return tp == 1 && threadIdx.x < io.row_lanes && i < io.in_lanes() ? in[i] : make_uint2(0, 0);
}

// Row r of my group into `row` (fp32, staged): summed over tp (reduce; partial lanes arrive in
// LL area 0), plus the residual and RMSNorm when fused (residual_out written), rounded to T as
// the reference's result is.
template <typename T>
__device__ __forceinline__ void stage_row(const CallCtx& cx, const TokenShape& s, bool reduce, int64_t r,
                                          const uint2* __restrict__ in, uint2 early, const uint2* __restrict__ residual,
                                          const uint2* __restrict__ weight, uint2* __restrict__ residual_out,
                                          float eps, const RowsArg& io, float* row, float* warp_buf) {
  constexpr int kN = Lane<T>::kN;
  const bool in_bounds = r < io.in_rows, fused = weight != nullptr, early_row = s.tp == 1 && r == blockIdx.x;
  float sumsq = 0.f;
  for (int64_t l = threadIdx.x; l < s.row_lanes; l += blockDim.x) {
    const int64_t i = r * s.row_lanes + l;
    const bool first = early_row && l == threadIdx.x;  // its first lane came early (early_lane)
    const uint2 local = first ? early : in_bounds ? in[i] : make_uint2(0, 0);
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

// Phase 0 of both kernels (tp > 1, partial rows): my partial lanes to the rank(s) that sum
// them -- the row's owner, or (fused) every tp peer, as all of them write the residual output.
__device__ __forceinline__ void send_partial_lanes(const CallCtx& cx, const TokenShape& s, bool fused,
                                                   const uint2* __restrict__ in, int64_t in_lanes) {
  const int64_t rows = s.rc.count(s.d);
  for (int64_t i = grid_thread(); i < rows * s.row_lanes; i += grid_threads()) {
    const uint2 v = i < in_lanes ? in[i] : make_uint2(0, 0);
    const int owner = owner_of(s, s.d, i / s.row_lanes);
    s.tp_group().for_each_other([&](int peer) {
      if (fused || peer == owner) put_lane(cx, peer, 0, i, v);
    });
  }
}

// Phase 0 and the rows of both kernels: my partial lanes sent (reduce), then one block per row I
// stage -- every row of my group when fused (the residual output), else my chunk -- and for the
// rows I own, send(r) (called by the whole block) quantizes and sends the staged row.
template <typename T, typename Send>
__device__ __forceinline__ void stage_my_rows(const CallCtx& cx, const TokenShape& s, bool reduce, bool fused,
                                              const uint2* __restrict__ in, uint2 early, const uint2* __restrict__ residual,
                                              const uint2* __restrict__ weight, uint2* __restrict__ residual_out,
                                              float eps, const RowsArg& io, float* row, float* warp_buf, Send send) {
  if (reduce) send_partial_lanes(cx, s, fused, in, io.in_lanes());
  const int64_t rows = s.rc.count(s.d);
  const int64_t first = fused ? 0 : chunk_begin(rows, s.t, s.tp), last = fused ? rows : chunk_begin(rows, s.t + 1, s.tp);
  for (int64_t r = first + blockIdx.x; r < last; r += gridDim.x) {
    stage_row<T>(cx, s, reduce, r, in, early, residual, weight, residual_out, eps, io, row, warp_buf);
    if (chunk_owner(r, rows, s.tp) == s.t) send(r);  // uniform over the block
  }
}

// Phase 1 of both kernels, grid-strided: receive(o, k, owner, j) for item k (of `items` a row) of
// every output row o that another rank owns (row j of its DP group).
template <typename Receive>
__device__ __forceinline__ void for_each_foreign_item(const TokenShape& s, int me, int64_t items, Receive receive) {
  const int64_t total = s.rc.offset[s.dp] * items;
  for (int64_t x = grid_thread(); x < total; x += grid_threads()) {
    const int64_t o = x / items, k = x % items;
    const int d = group_of_row(s, o);
    const int64_t j = o - s.rc.offset[d];
    const int owner = owner_of(s, d, j);
    if (owner != me) receive(o, k, owner, j);
  }
}

// Fingerprint fields the quantized gathers add: the format and the fusion (peers must agree).
template <int F>
__device__ __forceinline__ int quant_fields(bool fused) {
  return F | (fused ? 4 : 0);
}

// Dynamic shared memory of both kernels: the staged row (fp32), then its scale bytes.
inline size_t quant_staging_bytes(int64_t hidden) { return (size_t)hidden * sizeof(float) + (size_t)hidden / 4 + 16; }

// The launchers' argument check (both take a hidden size, a tp and, for nvfp4, a global scale).
inline bool quant_args_valid(const GroupArgs* g, int format, int tp, int64_t hidden, const float* global_scale) {
  return !(hidden % 16 || hidden <= 0 || hidden > kMaxQuantHidden || tp < 1 || g->nranks % tp ||
           (format == kQuantNvfp4 && !global_scale));
}

}  // namespace hc

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
