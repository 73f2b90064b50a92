#!/usr/bin/env bash
# Run 81, call 1, one H100 shared by 2 ranks: the quantized gathers' bytes floor on one GPU (bench
# quant with hc_bf16 and the Communicator's choice kept), then ncu of a quantized Lamport gather
# beside the bf16 Lamport gather that moves the same bytes (stall reasons, then the full set).
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$OUT/0_gpu.txt"
(
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/hc_mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/hc_mps_log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d || { echo "=== could not start the MPS daemon"; exit 2; }
  trap 'echo quit | nvidia-cuda-mps-control' EXIT
  timeout 240 python3 -m hybridcomm bench quant --world 2 --share-gpus --layouts dp2 --quant fp8,nvfp4 \
      --hidden 4096 --tokens 1,16,64,128,256,512,1024 --out "$OUT/1_quant_floor_dp2.json" > "$OUT/1_quant.log" 2>&1
)
timeout 150 python3 scripts/ncu_profile.py --share-gpus --world 2 --stalls --cases "same bytes" \
    --out "$OUT/2_ncu_stalls" > "$OUT/2_ncu_stalls.log" 2>&1
timeout 150 python3 scripts/ncu_profile.py --share-gpus --world 2 --cases "same bytes" \
    --out "$OUT/3_ncu_full" > "$OUT/3_ncu_full.log" 2>&1
tail -n 5 "$OUT"/*.log
