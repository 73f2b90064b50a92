#!/usr/bin/env bash
# Run 74, the probe after log 13: the PDL interleaved graph under MPS with max_sms=8 (pdl_mps_probe.py).
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 HYBRIDCOMM_TEST_GPU_RANKS=8
export PYTHONPATH=$PWD/src:$PWD/tests:$PWD/results/shared_1xH100/74_shared_gpu_memory
export CUDA_MPS_PIPE_DIRECTORY=/tmp/hc_mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/hc_mps_log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d || { echo "=== could not start the MPS daemon"; exit 2; }
trap 'echo quit | nvidia-cuda-mps-control' EXIT
timeout 500 python3 -c "import pdl_mps_probe; pdl_mps_probe.main(8)" > "$OUT/14_pdl_mps_max_sms8_world8.log" 2>&1
echo "rc=$?" >> "$OUT/14_pdl_mps_max_sms8_world8.log"
tail -n 15 "$OUT"/*.log
