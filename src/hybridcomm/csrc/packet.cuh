// The LL protocol: 16-byte packets carrying 8 bytes of payload and the call's flag twice,
// written by one 16-byte store straight into the receiver's area (push). The receiver polls
// its own memory until both flags equal the call's flag: data and "ready" arrive together,
// so small messages need no separate barrier. A torn store (8-byte atomicity) shows a stale
// flag in one half and is simply polled again. See docs/architecture.md.
#pragma once

#include "abi.h"

namespace hc {

// A 16-byte unit stored / loaded whole, past L1 (what a poller on this or another GPU sees).
__device__ __forceinline__ void store_unit_volatile(uint4* dst, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}

__device__ __forceinline__ uint4 load_unit_volatile(const uint4* src) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(src)
               : "memory");
  return v;
}

struct Packet {
  __device__ __forceinline__ static void put(uint4* dst, uint2 data, uint32_t flag) {
    store_unit_volatile(dst, make_uint4(data.x, flag, data.y, flag));
  }

  __device__ __forceinline__ static bool try_get(const uint4* src, uint32_t flag, uint2& data) {
    const uint4 v = load_unit_volatile(src);
    data = make_uint2(v.x, v.z);
    return v.y == flag && v.w == flag;
  }
};

}  // namespace hc
