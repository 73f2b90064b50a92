// Division of the kernels' indices and counts, which are never negative.
//
// nvcc turns a 64-bit `/` or `%` into a call of a ~70-instruction routine. A small call is one
// dependent chain per warp (ncu, 2x H200: the quantized Lamport gather at 128 tokens issued
// ~1,500 instructions per warp, ~11 cycles apart), and the routine was called per item: the
// chunk of every one-shot all_reduce lane, the source area of every re-filled Lamport unit, the
// row and owner of every received quantized item. Indices here fit in 32 bits in every real
// call, where a 32-bit division (inline, a handful of instructions) gives the same quotient; the
// 64-bit routine stays for the rest. Measured (2x H200, docs/latency.md "Index arithmetic"):
// all_reduce LL one-shot 3.21 -> 2.73 us at 2 KB, the quantized LL gather 6.68 -> 6.07 at 1 token.
#pragma once

#include <stdint.h>

namespace hc {

struct QuotRem {
  int64_t q, r;
};

// a / b and a % b for a >= 0, b > 0.
__device__ __forceinline__ QuotRem divmod(int64_t a, int64_t b) {
  if ((((uint64_t)a | (uint64_t)b) >> 32) == 0) {
    const uint32_t q = (uint32_t)a / (uint32_t)b;
    return QuotRem{(int64_t)q, (int64_t)((uint32_t)a - q * (uint32_t)b)};
  }
  const int64_t q = a / b;
  return QuotRem{q, a - q * b};
}

__device__ __forceinline__ int64_t quot(int64_t a, int64_t b) { return divmod(a, b).q; }

}  // namespace hc
