// Reductions over 8-byte lanes of T, accumulated in fp32 in source order (the reference's
// order, so the bits match it).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "exchange.cuh"

namespace hc {

// -- 8-byte lanes of T, accumulated in fp32 ----------------------------------------------------

template <typename T>
struct Lane;

template <>
struct Lane<float> {
  static constexpr int kDType = kFloat32;
  static constexpr int kN = 2;
  __device__ __forceinline__ static void unpack(uint2 v, float (&f)[4]) {
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
  }
  __device__ __forceinline__ static uint2 pack(const float (&f)[4]) {
    return make_uint2(__float_as_uint(f[0]), __float_as_uint(f[1]));
  }
};

template <>
struct Lane<__half> {
  static constexpr int kDType = kFloat16;
  static constexpr int kN = 4;
  __device__ __forceinline__ static void unpack(uint2 v, float (&f)[4]) {
    float2 a = __half22float2(*reinterpret_cast<__half2*>(&v.x));
    float2 b = __half22float2(*reinterpret_cast<__half2*>(&v.y));
    f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
  }
  __device__ __forceinline__ static uint2 pack(const float (&f)[4]) {
    __half2 a = __floats2half2_rn(f[0], f[1]);
    __half2 b = __floats2half2_rn(f[2], f[3]);
    return make_uint2(*reinterpret_cast<uint32_t*>(&a), *reinterpret_cast<uint32_t*>(&b));
  }
};

template <>
struct Lane<__nv_bfloat16> {
  static constexpr int kDType = kBFloat16;
  static constexpr int kN = 4;
  __device__ __forceinline__ static void unpack(uint2 v, float (&f)[4]) {
    float2 a = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v.x));
    float2 b = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v.y));
    f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
  }
  __device__ __forceinline__ static uint2 pack(const float (&f)[4]) {
    __nv_bfloat162 a = __floats2bfloat162_rn(f[0], f[1]);
    __nv_bfloat162 b = __floats2bfloat162_rn(f[2], f[3]);
    return make_uint2(*reinterpret_cast<uint32_t*>(&a), *reinterpret_cast<uint32_t*>(&b));
  }
};

// Sum of lanes in source order, fp32: ((v0 + v1) + v2) + ... -- the reference's order, so the
// bits match it. The first source initialises the sum (0 + -0 would lose the sign of zero).
// Sources: the first n of the N entries (N: kMaxRanks, or a kernel's compile-time group size).
template <typename T, int N>
__device__ __forceinline__ void sum_lanes(const uint2 (&v)[N], int n, float (&acc)[4]) {
  Lane<T>::unpack(v[0], acc);
#pragma unroll
  for (int s = 1; s < N; ++s) {
    if (s < n) {
      float f[4];
      Lane<T>::unpack(v[s], f);
#pragma unroll
      for (int k = 0; k < Lane<T>::kN; ++k) acc[k] += f[k];
    }
  }
}

// Sum of 16-byte units (two lanes each) over sources 0..n-1 in order, fp32, rounded once to T.
template <typename T, int N>
__device__ __forceinline__ uint4 sum_units(const uint4 (&v)[N], int n) {
  uint2 lo[N], hi[N];
#pragma unroll
  for (int s = 0; s < N; ++s) {
    lo[s] = make_uint2(v[s].x, v[s].y);
    hi[s] = make_uint2(v[s].z, v[s].w);
  }
  float a[4], b[4];
  sum_lanes<T>(lo, n, a);
  sum_lanes<T>(hi, n, b);
  const uint2 ra = Lane<T>::pack(a), rb = Lane<T>::pack(b);
  return make_uint4(ra.x, ra.y, rb.x, rb.y);
}

// Lane i summed over sources 0..n-1 in order, in fp32. Source `self` (-1: none) is `local`;
// the others are packets in my area `phase`, source s being group member member_base + s.
template <typename T>
__device__ __forceinline__ void sum_sources(const CallCtx& cx, int phase, int n, int self, int member_base, int64_t i,
                                            uint2 local, float (&acc)[4]) {
  uint2 data[kMaxRanks];
#pragma unroll
  for (int s = 0; s < kMaxRanks; ++s) data[s] = local;
  wait_sources(cx, phase, n, member_base, i, [&](int s) { return s != self; }, data);
  sum_lanes<T>(data, n, acc);
}

// The same, rounded once to T.
template <typename T>
__device__ __forceinline__ uint2 reduce_sources(const CallCtx& cx, int phase, int n, int self, int member_base,
                                                int64_t i, uint2 local) {
  float acc[4];
  sum_sources<T>(cx, phase, n, self, member_base, i, local, acc);
  return Lane<T>::pack(acc);
}

}  // namespace hc
