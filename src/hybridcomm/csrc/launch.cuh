// Host side of every launcher: grid size, dtype dispatch, the extern "C" error convention.
#pragma once

#include <cuda_runtime.h>

#include "protocol.cuh"

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

// Launch errors come back as the cudaError_t value (0 = success).
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
