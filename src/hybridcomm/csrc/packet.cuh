// The LL protocol: 16-byte packets carrying 8 bytes of payload and the call's flag twice,
// written by one 16-byte store straight into the receiver's area (push). The receiver polls
// its own memory until both flags equal the call's flag: data and "ready" arrive together,
// so small messages need no separate barrier. A torn store (8-byte atomicity) shows a stale
// flag in one half and is simply polled again. See docs/architecture.md.
#pragma once

#include "abi.h"

namespace hc {

struct Packet {
  __device__ __forceinline__ static void put(uint4* dst, uint2 data, uint32_t flag) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(data.x), "r"(flag),
                 "r"(data.y), "r"(flag)
                 : "memory");
  }

  __device__ __forceinline__ static bool try_get(const uint4* src, uint32_t flag, uint2& data) {
    uint32_t d0, f0, d1, f1;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(d0), "=r"(f0), "=r"(d1), "=r"(f1)
                 : "l"(src)
                 : "memory");
    data = make_uint2(d0, d1);
    return f0 == flag && f1 == flag;
  }
};

}  // namespace hc
