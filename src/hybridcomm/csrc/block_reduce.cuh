// Reductions over a thread block in a fixed order, so every thread, and every rank that
// reduces the same values, gets the same bits.
#pragma once

namespace hc {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);  // same bits on all lanes
  return v;
}

// Sum over the block (butterfly in each warp, then warps in index order).
__device__ __forceinline__ float block_sum(float v, float* warp_sums) {
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < (int)(blockDim.x >> 5); ++w) total += warp_sums[w];
  __syncthreads();  // warp_sums is reused by the next row
  return total;
}

// Max over `width` consecutive lanes of a warp (width a power of two up to 32); exact.
__device__ __forceinline__ float group_max(float v, int width) {
  for (int m = width >> 1; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}

__device__ __forceinline__ float block_max(float v, float* warp_buf) {
  v = group_max(v, 32);
  if ((threadIdx.x & 31) == 0) warp_buf[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = warp_buf[0];
  for (int w = 1; w < (int)(blockDim.x >> 5); ++w) m = fmaxf(m, warp_buf[w]);
  __syncthreads();
  return m;
}

}  // namespace hc
