// The quantizers' element conversions (quant.cuh) on a plain array, for the GPU test that
// compares them with the reference quantizer on every fp32 input (tests/test_gpu_quant.py):
// e4m3 and e2m1 codes two values at a time (to_e4m3x2, e2m1_code_pair), as the kernels make them.
#include <cuda_runtime.h>

#include "quant.cuh"

namespace hc {

__global__ void element_codes(int format, const float* __restrict__ in, uint8_t* __restrict__ out, int64_t n) {
  for (int64_t i = 2 * ((int64_t)blockIdx.x * blockDim.x + threadIdx.x); i < n; i += 2 * (int64_t)gridDim.x * blockDim.x) {
    const float a = in[i], b = i + 1 < n ? in[i + 1] : 0.0f;
    if (format == kQuantNvfp4) {
      const uint32_t codes = e2m1_code_pair(a, b);
      out[i] = (uint8_t)(codes & 0xFu);
      if (i + 1 < n) out[i + 1] = (uint8_t)(codes >> 16);
    } else {
      const uint16_t codes = to_e4m3x2(a, b);
      out[i] = (uint8_t)codes;
      if (i + 1 < n) out[i + 1] = (uint8_t)(codes >> 8);
    }
  }
}

}  // namespace hc

// out[i] = the code of in[i]: e4m3 for the fp8 formats, e2m1 (sign in bit 3) for nvfp4.
extern "C" int hc_element_codes(int format, const void* in, void* out, int64_t n, cudaStream_t stream) {
  if (format < hc::kQuantFp8 || format > hc::kQuantNvfp4 || n < 0) return (int)cudaErrorInvalidValue;
  if (n == 0) return 0;
  hc::element_codes<<<1024, 256, 0, stream>>>(format, (const float*)in, (uint8_t*)out, n);
  return (int)cudaGetLastError();
}
