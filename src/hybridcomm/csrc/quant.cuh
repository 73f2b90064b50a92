// Quantizers for the quantized gathers: bit-identical to hybridcomm.quant's reference
// (docs/quantization.md). Every operation is one IEEE fp32 operation rounded to nearest-even,
// written as an intrinsic (__fdiv_rn, __fmul_rn) so the compiler cannot contract or
// approximate it. Both conversions are done in integer arithmetic, exactly as the reference
// rounds: e4m3 like torch's .to(float8_e4m3fn) after the clamp to +-448 (CUDA documents
// cvt.rn.satfinite.e4m3x2.f32 as nearest-even too, but others report it disagreeing with
// torch at half-ulp boundaries on GPUs, and integer code cannot), e2m1 by the reference's
// thresholds (Hopper has no fp4 conversion).
#pragma once

#include <cuda_fp8.h>
#include <stdint.h>

#include "abi.h"

namespace hc {

constexpr float kE4m3Max = 448.0f;
constexpr float kE2m1Max = 6.0f;
constexpr float kAmaxFloor = 1e-10f;

// Elements per scale (0: the whole row), data elements per 8-byte wire lane, scale bytes.
template <int F> struct QuantTraits;
template <> struct QuantTraits<kQuantFp8> { static constexpr int kBlock = 0, kPerLane = 8, kScaleBytes = 4; };
template <> struct QuantTraits<kQuantFp8Block128> { static constexpr int kBlock = 128, kPerLane = 8, kScaleBytes = 4; };
template <> struct QuantTraits<kQuantNvfp4> { static constexpr int kBlock = 16, kPerLane = 16, kScaleBytes = 1; };

// fp32 -> e4m3 (float8_e4m3fn), nearest-even, saturating to +-448; NaN -> 0x7f whatever its
// sign, so no code is 0xFF (the Lamport sentinel's byte: docs/quantization.md "Reserved pattern").
__device__ __forceinline__ uint8_t to_e4m3(float v) {
  const uint32_t bits = __float_as_uint(v), sign = (bits >> 24) & 0x80u;
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fu;
  const uint32_t a = __float_as_uint(fminf(fabsf(v), kE4m3Max));
  if (a < 0x3c800000u) {  // below 2^-6, the smallest normal: a multiple of 2^-9 (0..8; 8 is 2^-6)
    return (uint8_t)(__float2uint_rn(__fmul_rn(__uint_as_float(a), 512.0f)) | sign);
  }
  // Keep 3 of the 23 mantissa bits, nearest-even (a carry moves into the exponent); rebias
  // the exponent from 127 to 7: the code is (exponent << 3 | mantissa) - (120 << 3).
  const uint32_t rounded = a + 0x7ffffu + ((a >> 20) & 1u);
  return (uint8_t)(((rounded >> 20) - (120u << 3)) | sign);
}

__device__ __forceinline__ float e4m3_value(uint8_t b) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3)));
}

// fp8 formats: the scale of a block with max |v| = amax, and the multiplier of its values.
struct Fp8Scale {
  float scale, inv;
};

__device__ __forceinline__ Fp8Scale fp8_scale(float amax) {
  const float a = fmaxf(amax, kAmaxFloor);
  const float scale = __fdiv_rn(a, kE4m3Max);
  return Fp8Scale{scale, __fdiv_rn(1.0f, scale)};
}

__device__ __forceinline__ uint8_t fp8_code(float v, float inv) { return to_e4m3(__fmul_rn(v, inv)); }

// nvfp4: the stored e4m3 scale of a 16-block and the multiplier of its values.
struct Nvfp4Scale {
  uint8_t sf;
  float inv;
};

__device__ __forceinline__ Nvfp4Scale nvfp4_scale(float amax, float global_scale) {
  const uint8_t sf = to_e4m3(__fmul_rn(global_scale, __fdiv_rn(amax, kE2m1Max)));
  const float sf_value = e4m3_value(sf);
  return Nvfp4Scale{sf, sf_value == 0.0f ? 0.0f : __fdiv_rn(global_scale, sf_value)};
}

// e2m1, nearest-even on 0, .5, 1, 1.5, 2, 3, 4, 6, saturating; sign bit from q, except that
// zero is always +0 (code 0x0, never 0x8: so a word of eight 0x8 codes is no real data and the
// Lamport wire can stand it in for eight -6.0s, lamport_quant_gather.cu). NaN gives +0.
__device__ __forceinline__ uint32_t e2m1_code(float q) {
  const float a = fabsf(q);
  const uint32_t code = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  return code ? code | ((__float_as_uint(q) >> 31) << 3) : 0u;
}

__device__ __forceinline__ uint32_t nvfp4_code(float v, float inv) { return e2m1_code(__fmul_rn(v, inv)); }

}  // namespace hc
