// Host side of every launcher: grid size, dtype dispatch, the extern "C" error convention.
#pragma once

#include <cuda_runtime.h>

#include "bulk.cuh"
#include "lanes.cuh"
#include "pdl.cuh"
#include "rows.cuh"

namespace hc {

// Enough blocks for `work` items at one item per thread, at most one block per SM: every
// block of a kernel that waits on peers must be resident, or a waiting block could keep a
// sending one from ever starting.
inline int blocks_for(int64_t work, const GroupArgs& g) {
  int64_t b = (work + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  if (b > g.max_blocks) b = g.max_blocks;
  return (int)b;
}

// A row kernel's geometry from a launcher's arguments. Counts: a device array (graph replays
// with new counts), or the first n host values inline; or, given own_count (own_count.cuh),
// this rank's count alone, sizes_device then being where the kernel writes every member's.
inline RowsArg rows_arg(const int32_t* sizes_device, const int32_t* sizes_host, int n, int64_t row_bytes,
                        int64_t in_rows, int64_t out_rows, const int32_t* own_count = nullptr) {
  RowsArg io{{own_count ? nullptr : sizes_device, {}, own_count, own_count ? (int32_t*)sizes_device : nullptr},
             row_bytes / 8, in_rows, out_rows};
  for (int i = 0; i < n && !sizes_device; ++i) io.sizes.host[i] = sizes_host[i];
  return io;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Errors of a <<<>>> launch come back as the cudaError_t value (0 = success); launch_kernel
// (pdl.cuh) returns its own.
inline int launch_status() { return (int)cudaGetLastError(); }

}  // namespace hc

// Calls BODY with `Elem` bound to the C++ type of dtype code DT; unknown codes return an error.
#define HC_DISPATCH_DTYPE(DT, ...)                      \
  switch (DT) {                                         \
    case hc::kFloat32: {                                \
      using Elem = float;                               \
      __VA_ARGS__;                                      \
      break;                                            \
    }                                                   \
    case hc::kFloat16: {                                \
      using Elem = __half;                              \
      __VA_ARGS__;                                      \
      break;                                            \
    }                                                   \
    case hc::kBFloat16: {                               \
      using Elem = __nv_bfloat16;                       \
      __VA_ARGS__;                                      \
      break;                                            \
    }                                                   \
    default:                                            \
      return (int)cudaErrorInvalidValue;                \
  }
