#!/usr/bin/env bash
# Run 74, last call, one H100: the 1000-replay graph tests on 8 ranks under CUDA MPS, where the
# ranks' kernels run side by side (time slices did not finish TP4's in 290 s on world 4).
# MPS can end calls of many blocks in PeerTimeout (docs/architecture.md, "Not MPS"); these use small rows.
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
export CUDA_MPS_PIPE_DIRECTORY=/tmp/hc_mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/hc_mps_log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d || { echo "=== could not start the MPS daemon"; exit 2; }
trap 'echo quit | nvidia-cuda-mps-control' EXIT
timeout 540 python3 -m pytest -v -p no:cacheprovider -m gpu --gpu-ranks 8 \
    tests/test_gpu.py tests/test_gpu_lamport.py -k "1000_times or graph_interleaving" \
    > "$OUT/13_graph_1000_replays_world8_mps.log" 2>&1
tail -n 12 "$OUT"/*.log
