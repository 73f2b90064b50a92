// The launcher of lamport_quant_local.cu (algorithm quant_local), called by
// hc_lamport_quant_gather (lamport_quant_gather.cu) for that algorithm: the same arguments,
// less those it does not take (partial rows only; fused only with one DP group).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "abi.h"

namespace hc {

int launch_lamport_quant_local(const GroupArgs* g, const LamportArgs* l, int format, int dtype, int tp,
                               const void* in, const void* residual, const void* weight, void* residual_out,
                               float eps, const float* global_scale, void* out_data, void* out_scales,
                               const int32_t* sizes_device, const int32_t* sizes_host, const int32_t* own_count,
                               int64_t hidden, int64_t in_rows, int64_t out_rows, int pdl, cudaStream_t stream);

}  // namespace hc
