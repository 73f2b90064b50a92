// Quantizers for the quantized gathers: bit-identical to hybridcomm.quant's reference
// (docs/quantization.md). Every operation is one IEEE fp32 operation rounded to nearest-even,
// written as an intrinsic (__fdiv_rn, __fmul_rn) so the compiler cannot contract or
// approximate it. e4m3 codes come from the hardware conversion (cvt.rn.satfinite.e4m3x2.f32,
// two values an instruction): it equals the reference (torch's .to(float8_e4m3fn) after the
// clamp to +-448, NaN -> 0x7f) on every one of the 2^32 fp32 inputs (tests/test_gpu_quant.py,
// through element_codes.cu; it replaced ~10 integer instructions per value). Hopper has no fp4
// conversion: e2m1 codes are the reference's threshold comparisons, made two values at a time
// in packed bf16 (e2m1_code_pair; the same test checks every input).
#pragma once

#include <cuda_bf16.h>
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

// ---- e2m1, two values at a time -------------------------------------------------------------
// The reference's code of a = |q| is the number of thresholds passed (docs/quantization.md):
// a > 0.25, a >= 0.75, a > 1.25, a >= 1.75, a > 2.5, a >= 3.5, a > 5 (strict where the tie goes
// down to an even code). Written as seven fp32 comparisons and a sum, ptxas made ~24
// instructions a value of it (ncu, results/shared_1xH100/81_quant_floor). Here two values share
// each instruction: both are truncated (round toward zero) to bf16 in one conversion, and the
// 16-bit lanes are compared in packed bf16, which holds every threshold exactly. That is exact:
// - a >= t  <=>  rz(a) >= t for any t that bf16 represents (truncation is monotone and keeps t);
// - a > t   <=>  rz(a-) >= t, where a- = a * (1 - 2^-24), which is the fp32 value just below a
//   for every normal a (below 2^-126 both sides are false; infinity stays infinity, where both
//   are true), so the strict thresholds compare a- instead.
// A code's three bits are a binary search (bit 2: a >= 1.75; bit 1: against 3.5 or 0.75; bit 0:
// against 5, 2.5, 1.25 or 0.25), each comparison giving an all-ones or zero 16-bit lane mask;
// masks select thresholds and assemble codes with LOP3s. NaN compares false everywhere: code 0.

__device__ __forceinline__ uint32_t bf16x2_toward_zero(float lo, float hi) {  // lo in bits 0-15
  uint32_t r;
  asm("cvt.rz.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// 0xFFFF in each 16-bit lane where a >= b (le: a <= b), compared as bf16.
__device__ __forceinline__ uint32_t bf16x2_ge(uint32_t a, uint32_t b) {
  return __hge2_mask(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
}
__device__ __forceinline__ uint32_t bf16x2_le(uint32_t a, uint32_t b) {
  return __hle2_mask(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
}

// Bits of if_set where mask has them, of if_clear elsewhere: one LOP3, two where if_set and if_clear
// are both constants (an instruction takes one immediate: results/shared_1xH100/84_e2m1_pairs).
__device__ __forceinline__ uint32_t select_bits(uint32_t mask, uint32_t if_set, uint32_t if_clear) {
  return (mask & if_set) | (~mask & if_clear);
}

// A bf16 constant in both lanes (bf16 = the top half of the fp32).
constexpr uint32_t bf16_lanes(uint32_t fp32_bits) { return (fp32_bits >> 16) * 0x10001u; }
constexpr uint32_t kBf16Lanes0_25 = bf16_lanes(0x3E800000u), kBf16Lanes0_75 = bf16_lanes(0x3F400000u);
constexpr uint32_t kBf16Lanes1_25 = bf16_lanes(0x3FA00000u), kBf16Lanes1_75 = bf16_lanes(0x3FE00000u);
constexpr uint32_t kBf16Lanes2_5 = bf16_lanes(0x40200000u), kBf16Lanes3_5 = bf16_lanes(0x40600000u);
constexpr uint32_t kBf16Lanes5 = bf16_lanes(0x40A00000u), kBf16LanesMinus0_25 = bf16_lanes(0xBE800000u);
constexpr float kJustBelowOne = 0x1.fffffep-1f;  // 1 - 2^-24: a * it is the fp32 value below a

// The e2m1 codes of lo and hi in bits 0-3 and 16-19, every other bit 0. Bit 3 of a code is q's
// sign, except that zero is always +0 (never code 0x8: the Lamport wire relies on it,
// lamport_quant_gather.cu); so bit 3 is "q < 0 and |q| > 0.25".
__device__ __forceinline__ uint32_t e2m1_code_pair(float lo, float hi) {
  const uint32_t at = bf16x2_toward_zero(lo, hi);
  const uint32_t below = bf16x2_toward_zero(__fmul_rn(lo, kJustBelowOne), __fmul_rn(hi, kJustBelowOne));
  const uint32_t a = at & 0x7FFF7FFFu, a_below = below & 0x7FFF7FFFu;  // |.|
  const uint32_t bit2 = bf16x2_ge(a, kBf16Lanes1_75);
  const uint32_t bit1 = bf16x2_ge(a, select_bits(bit2, kBf16Lanes3_5, kBf16Lanes0_75));
  const uint32_t strict = select_bits(bit1, select_bits(bit2, kBf16Lanes5, kBf16Lanes1_25),
                                      select_bits(bit2, kBf16Lanes2_5, kBf16Lanes0_25));
  const uint32_t bit0 = bf16x2_ge(a_below, strict);
  const uint32_t negative = bf16x2_le(below, kBf16LanesMinus0_25);  // q < 0 and |q| > 0.25
  const uint32_t magnitude = select_bits(0x00030003u, select_bits(0x00010001u, bit0, bit1), bit2);
  return select_bits(0x00070007u, magnitude, negative & 0x00080008u);
}

// N codes of v[i] * inv packed four bits each, v[0]'s in bits 0-3 (N = 4: 16 bits). Pairs are
// (0, 2) and (1, 3), so pair(0, 2) | pair(1, 3) << 4 holds codes 0, 1 in byte 0 and 2, 3 in byte 2.
template <int N>
__device__ __forceinline__ uint32_t nvfp4_codes(const float* v, float inv) {
  static_assert(N == 4 || N == 8, "a word holds eight codes");
  uint32_t quad[N / 4];
#pragma unroll
  for (int h = 0; h < N / 4; ++h) {
    const float* w = v + 4 * h;
    const uint32_t even = e2m1_code_pair(__fmul_rn(w[0], inv), __fmul_rn(w[2], inv));
    const uint32_t odd = e2m1_code_pair(__fmul_rn(w[1], inv), __fmul_rn(w[3], inv));
    quad[h] = even | odd << 4;
  }
  if constexpr (N == 4) return __byte_perm(quad[0], 0u, 0x4420);
  else return __byte_perm(quad[0], quad[1], 0x6420);
}

}  // namespace hc
