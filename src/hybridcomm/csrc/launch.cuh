// Host side of every launcher: grid size, dtype dispatch, the extern "C" error convention.
#pragma once

#include <cuda_runtime.h>

#include "bulk.cuh"
#include "lanes.cuh"
#include "pdl.cuh"
#include "rows.cuh"

namespace hc {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Enough blocks of `threads` for `work` items at one item per thread, at most one block per SM:
// every block of a kernel that waits on peers must be resident, or a waiting block could keep a
// sending one from ever starting.
inline int blocks_for(int64_t work, const GroupArgs& g, int threads = kThreads) {
  int64_t b = ceil_div(work, threads);
  if (b < 1) b = 1;
  if (b > g.max_blocks) b = g.max_blocks;
  return (int)b;
}

// A launch's shape.
struct Grid {
  int blocks, threads;
};

// Block sizes of a spread grid, smallest first.
constexpr int kSpreadBlockThreads[] = {128, 256, kThreads};

// The grid of the unquantized kernels: `work` items spread over as many SMs as the group may use
// before its blocks grow -- the smallest block size whose grid fits g.max_blocks, else full
// blocks, capped. Why: a small call is one chain of dependent instructions per warp, and the
// warps on an SM share its 4 schedulers; a 512-thread block puts 4 warps on each (ncu, 2x H200:
// a warp issued every ~8.7 cycles, ~1.3 of them "not selected"), a 128-thread block one.
// Measured with 2 ranks sharing an H100 under MPS (results/shared_1xH100, runs 38-39; no NVLink
// there): against full blocks, the 1-8 token transitions mostly 0.70-0.90x (the Lamport DP
// gather of 1 token 1.06x), the 32-128 KB ops 0.77-1.0x, 32 tokens and up unchanged; always
// 128-thread blocks lost up to 3x from 16 tokens, where their grid was capped -- hence the
// smallest size that fits, not the smallest. Work that fits one full block stays one block: a
// single block skips end_call's fence, which on NVLink waits for its stores to be acknowledged
// (call.cuh).
inline Grid spread_grid(int64_t work, const GroupArgs& g) {
  if (work <= kThreads) return Grid{1, kThreads};
  for (int threads : kSpreadBlockThreads)
    if (ceil_div(work, threads) <= g.max_blocks) return Grid{(int)ceil_div(work, threads), threads};
  return Grid{blocks_for(work, g), kThreads};
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

// Which rows a row kernel's threads cover, one lane (or unit) each: one member's (its loops run
// over member j's rows at the same lanes for every j: gathers and reduce-scatters) or all of
// them back to back (the token transitions' output).
enum class RowsSpan { kLargest, kAll };

// Rows to size a row kernel's grid by. Host counts: the largest count or their sum, at most
// `capacity` (a grid-stride loop covers any count, so this only sizes the grid; fewer blocks
// wait less for each other, and one block skips end_call's fence and count). Counts known only
// in the kernel (device, own-count): `capacity`, the most the buffers let them be.
inline int64_t grid_rows(const RowsArg& io, int n, RowsSpan span, int64_t capacity) {
  if (io.sizes.device || io.sizes.own) return capacity;
  int64_t largest = 0, all = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t c = io.sizes.host[i] > 0 ? io.sizes.host[i] : 0;
    largest = c > largest ? c : largest;
    all += c;
  }
  const int64_t rows = span == RowsSpan::kLargest ? largest : all;
  return rows < capacity ? rows : capacity;
}

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
