// Programmatic dependent launch (PDL): a kernel launched with the programmatic-stream-
// serialization attribute may start while the kernel before it on the stream is still
// running. Its blocks become resident and run up to `wait_for_previous_kernel()`, which
// returns once the previous kernel has completed and its memory operations are visible.
// So launch, block scheduling and the work before that call overlap the previous kernel.
//
// Rule for every kernel launched with pdl = 1: before wait_for_previous_kernel() it may only
// compute from its parameters; it must not read or write memory that an earlier kernel may
// still be using. Our kernels read the group's call counters (written by the previous call
// of the same group, which may be the very kernel still running) and write receive areas the
// previous call may still be reading, so everything that touches memory comes after the wait.
// Without the attribute both instructions are no-ops, so the same kernel runs either way.
//
// `allow_next_kernel()` lets the next PDL kernel of the stream be scheduled early. It does not
// publish anything: the next kernel's wait still waits for this whole kernel to complete, so
// it is safe anywhere; we call it right after our own wait (the earlier the better, and all
// our blocks are already resident by then, so the next kernel cannot take their places).
#pragma once

#include <cuda_runtime.h>

namespace hc {

__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_next_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launches kernel<<<blocks, threads, smem_bytes, stream>>>(args...), with PDL when `pdl` is
// nonzero. Returns the launch's cudaError_t as an int (0 = success).
template <typename... Params, typename... Args>
inline int launch_kernel_smem(void (*kernel)(Params...), int blocks, int threads, size_t smem_bytes,
                              cudaStream_t stream, int pdl, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
  config.attrs = attribute;
  config.numAttrs = 1;
  return (int)cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

// The same without dynamic shared memory (every kernel but the quantized gather).
template <typename... Params, typename... Args>
inline int launch_kernel(void (*kernel)(Params...), int blocks, int threads, cudaStream_t stream, int pdl,
                         Args... args) {
  return launch_kernel_smem(kernel, blocks, threads, 0, stream, pdl, args...);
}

}  // namespace hc
