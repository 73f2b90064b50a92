// Division of the kernels' indices and counts, which are never negative.
//
// nvcc turns a 64-bit `/` or `%` into a call of a ~70-instruction routine. In the per-item
// loops (which row and which unit an item is, whose chunk a row is in, which area a re-filled
// unit belongs to) a few of those per item were most of the time between a kernel's sends and
// its first poll: ncu on 2x H200 counted ~1,500 instructions per warp in the quantized Lamport
// gather of 128 tokens, issued at ~11 cycles each (4 warps per scheduler hide little), and the
// trace put ~1.3-1.5 us from the re-fill to the first poll. Indices here fit in 32 bits in
// every real call, where a 32-bit division (inline, a handful of instructions) gives the same
// quotient; the 64-bit routine stays for the rest.
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
