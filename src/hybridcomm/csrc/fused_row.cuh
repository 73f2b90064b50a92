// Residual add + RMSNorm of one row on the Lamport protocol, a block a row (full kThreads
// blocks): the fused gathers' row work, shared by lamport_fused_tokens.cu (the rows as they are)
// and lamport_quant_local.cu (the rows quantized).
//
// Bits: the row's units are summed over their sources in source order in fp32, the residual
// added before the single rounding to T (residual_out), and the RMSNorm takes its sum of squares
// exactly as gather_tokens.cu's gather_fused does (each thread over the 8-byte lanes threadIdx.x
// + j * blockDim.x, then block_sum); so the normed rows are that LL kernel's, bit for bit.
#pragma once

#include "block_reduce.cuh"
#include "lamport.cuh"

namespace hc {

// The fused call's tensors, in 16-byte units of T (residual null: not fused).
struct Fusion {
  const uint4* __restrict__ residual;
  const uint4* __restrict__ weight;
  uint4* __restrict__ residual_out;
  float eps;
};

// Values of T in one 16-byte unit.
template <typename T>
constexpr int kUnitValues = 2 * Lane<T>::kN;

// Row r (of `units` units), every thread of the block: the thread's units u = threadIdx.x + k *
// kThreads (k < KU) summed over the n sources member_base + s (s < n, in that order; source
// `self` is me, its unit my(i), fix_reserved applied; the others arrive in my Lamport areas),
// plus the residual, rounded once to T: into residual_out (rows below in_rows) and, as fp32,
// into row[u * kUnitValues .. ] (the thread's own elements). Returns the norm's scale,
// 1 / sqrt(mean of squares + eps). n = 1 with self = 0: the row is my own input alone.
template <typename T, int KU, typename MyUnit>
__device__ __forceinline__ float stage_fused_row(const LamportCall& lc, int n, int member_base, int self, int64_t r,
                                                 MyUnit my, const Fusion& fu, int64_t units, int64_t in_rows,
                                                 float* row, float* warp_buf) {
  constexpr int kV = kUnitValues<T>, kN = Lane<T>::kN;
  const bool in_bounds = r < in_rows;
#pragma unroll 1
  for (int k = 0; k < KU; ++k) {
    const int64_t u = threadIdx.x + (int64_t)k * kThreads;
    if (u >= units) continue;
    const int64_t i = r * units + u;
    uint4 data[kMaxRanks];
    receive_units(lc, n, member_base, true, self, i, my(i), data);
    uint2 lo[kMaxRanks], hi[kMaxRanks];
#pragma unroll
    for (int s = 0; s < kMaxRanks; ++s) {
      lo[s] = make_uint2(data[s].x, data[s].y);
      hi[s] = make_uint2(data[s].z, data[s].w);
    }
    float a[4], b[4], ra[4], rb[4];
    sum_lanes<T>(lo, n, a);
    sum_lanes<T>(hi, n, b);
    const uint4 res = in_bounds ? fu.residual[i] : make_uint4(0, 0, 0, 0);
    Lane<T>::unpack(make_uint2(res.x, res.y), ra);
    Lane<T>::unpack(make_uint2(res.z, res.w), rb);
#pragma unroll
    for (int e = 0; e < kN; ++e) a[e] += ra[e], b[e] += rb[e];
    const uint2 pa = Lane<T>::pack(a), pb = Lane<T>::pack(b);
    if (in_bounds) fu.residual_out[i] = make_uint4(pa.x, pa.y, pb.x, pb.y);
    Lane<T>::unpack(pa, a);  // the norm sees the rounded residual
    Lane<T>::unpack(pb, b);
#pragma unroll
    for (int e = 0; e < kN; ++e) row[u * kV + e] = a[e], row[u * kV + kN + e] = b[e];
  }
  __syncthreads();  // the row is staged
  const int64_t row_lanes = 2 * units;
  const float inv_hidden = 1.0f / (float)(row_lanes * kN);
  float sumsq = 0.f;
  for (int64_t l = threadIdx.x; l < row_lanes; l += blockDim.x) {
#pragma unroll
    for (int e = 0; e < kN; ++e) {
      const float a = row[l * kN + e];
      sumsq += a * a;
    }
  }
  // (block_sum's barriers: every thread has read the staged row before anyone goes on; after
  // that each thread reads only its own elements, so the next row may stage over them.)
  return 1.0f / sqrtf(block_sum(sumsq, warp_buf) * inv_hidden + fu.eps);
}

// Unit u of a staged row normed (x * scale * weight) and rounded to T: returned packed, and its
// rounded values in v.
template <typename T>
__device__ __forceinline__ uint4 normed_unit(const float* row, int64_t u, float scale,
                                             const uint4* __restrict__ weight, float (&v)[kUnitValues<T>]) {
  constexpr int kV = kUnitValues<T>, kN = Lane<T>::kN;
  const uint4 w4 = weight[u];
  float wa[4], wb[4];
  Lane<T>::unpack(make_uint2(w4.x, w4.y), wa);
  Lane<T>::unpack(make_uint2(w4.z, w4.w), wb);
  float a[4], b[4];
#pragma unroll
  for (int e = 0; e < kN; ++e) a[e] = row[u * kV + e] * scale * wa[e], b[e] = row[u * kV + kN + e] * scale * wb[e];
  const uint2 pa = Lane<T>::pack(a), pb = Lane<T>::pack(b);
  Lane<T>::unpack(pa, a);
  Lane<T>::unpack(pb, b);
#pragma unroll
  for (int e = 0; e < kN; ++e) v[e] = a[e], v[kN + e] = b[e];
  return make_uint4(pa.x, pa.y, pb.x, pb.y);
}

}  // namespace hc
