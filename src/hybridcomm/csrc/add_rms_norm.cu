// Residual add + RMSNorm of rows in one kernel, the semantics of norm.py:
//   residual_out = T(float(reduced) + float(residual))       (one rounding)
//   normed       = T(v * (1 / sqrt(mean(v * v) + eps)) * float(w)),  v = float(residual_out)
// Nothing travels here. The NCCL baseline's fused transition runs it between its collectives,
// where engines run their own fused add + RMSNorm kernel (backends/nccl.py): without it that
// path paid ~13 small torch kernels a call (scripts/norm_baseline.py). A block a row, its lanes
// spread over the threads and summed as gather_tokens_norm sums them (block_sum over kThreads).
#include <cuda_runtime.h>

#include "block_reduce.cuh"
#include "launch.cuh"

namespace hc {

template <typename T>
__global__ void __launch_bounds__(kThreads) add_rms_norm(const uint2* __restrict__ reduced,
                                                         const uint2* __restrict__ residual,
                                                         const uint2* __restrict__ weight, float eps,
                                                         uint2* __restrict__ normed, uint2* __restrict__ residual_out,
                                                         int64_t rows, int64_t row_lanes) {
  __shared__ float warp_sums[kThreads / 32];
  const float inv_hidden = 1.0f / (float)(row_lanes * Lane<T>::kN);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float sumsq = 0.f;
    for (int64_t l = threadIdx.x; l < row_lanes; l += blockDim.x) {
      const int64_t i = r * row_lanes + l;
      float acc[4], res[4];
      Lane<T>::unpack(reduced[i], acc);
      Lane<T>::unpack(residual[i], res);
#pragma unroll
      for (int k = 0; k < Lane<T>::kN; ++k) acc[k] += res[k];
      const uint2 packed = Lane<T>::pack(acc);
      residual_out[i] = packed;
      Lane<T>::unpack(packed, acc);  // the norm sees the rounded residual
#pragma unroll
      for (int k = 0; k < Lane<T>::kN; ++k) sumsq += acc[k] * acc[k];
    }
    const float scale = 1.0f / sqrtf(block_sum(sumsq, warp_sums) * inv_hidden + eps);
    for (int64_t l = threadIdx.x; l < row_lanes; l += blockDim.x) {
      const int64_t i = r * row_lanes + l;
      float v[4], w[4];
      Lane<T>::unpack(residual_out[i], v);  // this thread's own store
      Lane<T>::unpack(weight[l], w);
#pragma unroll
      for (int k = 0; k < Lane<T>::kN; ++k) v[k] = v[k] * scale * w[k];
      normed[i] = Lane<T>::pack(v);
    }
  }
}

// The grid: a block a row, at most kMaxNormBlocks (a grid-stride loop covers the rest).
constexpr int64_t kMaxNormBlocks = 1024;

}  // namespace hc

// rows x (row_bytes / element size) elements of `dtype` (abi.h codes) in every tensor but weight
// (one row); row_bytes a multiple of 8 (a lane). Returns a CUDA error code (0: launched).
extern "C" int hc_add_rms_norm(int dtype, const void* reduced, const void* residual, const void* weight, float eps,
                               void* normed, void* residual_out, int64_t rows, int64_t row_bytes,
                               cudaStream_t stream) {
  if (rows < 0 || row_bytes <= 0 || row_bytes % 8) return (int)cudaErrorInvalidValue;
  if (rows == 0) return 0;
  const int blocks = (int)(rows < hc::kMaxNormBlocks ? rows : hc::kMaxNormBlocks);
  HC_DISPATCH_DTYPE(dtype, {
    hc::add_rms_norm<Elem><<<blocks, hc::kThreads, 0, stream>>>(
        (const uint2*)reduced, (const uint2*)residual, (const uint2*)weight, eps, (uint2*)normed,
        (uint2*)residual_out, rows, row_bytes / 8);
  });
  return (int)cudaGetLastError();
}
