// Quantizers for the quantized gathers: bit-identical to hybridcomm.quant's reference
// (docs/quantization.md). Every operation is one IEEE fp32 operation rounded to nearest-even,
// written as an intrinsic (__fdiv_rn, __fmul_rn) so the compiler cannot contract or
// approximate it. e4m3 codes come from the hardware conversion (cvt.rn.satfinite.e4m3x2.f32,
// two values an instruction): it equals the reference (torch's .to(float8_e4m3fn) after the
// clamp to +-448, NaN -> 0x7f) on every one of the 2^32 fp32 inputs (tests/test_gpu_quant.py,
// through element_codes.cu; it replaced ~10 integer instructions per value). e2m1 codes are
// computed by the reference's thresholds (Hopper has no fp4 conversion).
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
// Two values: lo's code in the low byte.
__device__ __forceinline__ uint16_t to_e4m3x2(float lo, float hi) {
  return (uint16_t)__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ uint8_t to_e4m3(float v) { return (uint8_t)to_e4m3x2(v, 0.0f); }

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

// The codes of two values scaled by inv (a's in the low byte).
__device__ __forceinline__ uint32_t fp8_codes(float a, float b, float inv) {
  return to_e4m3x2(__fmul_rn(a, inv), __fmul_rn(b, inv));
}

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
