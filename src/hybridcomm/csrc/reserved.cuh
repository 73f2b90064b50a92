// The reserved bit pattern (hybridcomm/reserved.py says what it means for users).
//
// Lamport receive buffers hold the sentinel word 0xFFFFFFFF where nothing has arrived
// (lamport.cuh), so no word of data may equal it. Every kernel passes communicated inputs
// through fix_reserved before sending them or using them locally (so all ranks hold the same
// bits, LL kernels included): an element whose bits are all ones -- fp32 0xFFFFFFFF, fp16 /
// bf16 0xFFFF, a negative NaN in each -- becomes all ones but the lowest bit (0xFFFFFFFE /
// 0xFFFE, still a negative NaN). Per element, so a 32-bit word of two fp16/bf16 elements can
// never be the sentinel either. No number and no sign of zero changes.
#pragma once

#include <stdint.h>

#include "abi.h"

namespace hc {

constexpr uint32_t kSentinelWord = 0xFFFFFFFFu;

template <int Bytes>
__device__ __forceinline__ uint32_t fix_reserved_word(uint32_t w);

template <>
__device__ __forceinline__ uint32_t fix_reserved_word<4>(uint32_t w) {
  return w == 0xFFFFFFFFu ? 0xFFFFFFFEu : w;
}

template <>
__device__ __forceinline__ uint32_t fix_reserved_word<2>(uint32_t w) {
  if ((w & 0xFFFFu) == 0xFFFFu) w ^= 0x1u;
  if ((w >> 16) == 0xFFFFu) w ^= 0x10000u;
  return w;
}

template <typename T>
__device__ __forceinline__ uint4 fix_reserved(uint4 v) {
  constexpr int B = (int)sizeof(T);
  return make_uint4(fix_reserved_word<B>(v.x), fix_reserved_word<B>(v.y), fix_reserved_word<B>(v.z),
                    fix_reserved_word<B>(v.w));
}

template <typename T>
__device__ __forceinline__ uint2 fix_reserved(uint2 v) {
  constexpr int B = (int)sizeof(T);
  return make_uint2(fix_reserved_word<B>(v.x), fix_reserved_word<B>(v.y));
}

// The same for a kernel that moves any dtype (code: abi.h DType, or kOtherDType: types the
// kernels do not reduce, moved unchanged; the Lamport kernels do not carry them).
__device__ __forceinline__ uint2 fix_reserved_lane(uint2 v, int dtype) {
  if (dtype == kFloat32) return fix_reserved<float>(v);
  if (dtype == kFloat16 || dtype == kBFloat16) return make_uint2(fix_reserved_word<2>(v.x), fix_reserved_word<2>(v.y));
  return v;
}

}  // namespace hc
