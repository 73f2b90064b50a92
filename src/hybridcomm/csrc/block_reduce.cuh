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

// Max over the block (blockDim.x a multiple of 32, at most 1024); exact, so in any order: each
// warp takes the warps' maxima one per lane and shuffles them (one shared load a thread, not a
// loop over the warps: ~0.2 us of dependent loads at 16 warps, trace of quant_local).
__device__ __forceinline__ float block_max(float v, float* warp_buf) {
  v = group_max(v, 32);
  const int lane = threadIdx.x & 31, warps = (int)(blockDim.x >> 5);
  if (lane == 0) warp_buf[threadIdx.x >> 5] = v;
  __syncthreads();
  const float m = group_max(warp_buf[lane < warps ? lane : 0], 32);
  __syncthreads();  // warp_buf is reused by the next row
  return m;
}

}  // namespace hc
