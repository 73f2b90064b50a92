#!/usr/bin/env bash
# Run 84, call 6, one H100 shared by 2 ranks under MPS, main's build: tp2_check.py (the TP2
# quantized LL gather at 512 and 1024 tokens with bench quant's workspaces: right? how slow?).
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
P=results/shared_1xH100/84_e2m1_pairs/e2m1_pairs.patch
R=call_${RUN:-6}; mkdir -p $R .hc_cache/hybridcomm
for lib in .hc_cache/libs/*.xz; do [ -e "$lib" ] && xz -dc "$lib" > .hc_cache/hybridcomm/"$(basename "$lib" .xz)"; done
export CUDA_MPS_PIPE_DIRECTORY=/tmp/hc_mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/hc_mps_log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d || { echo "=== could not start the MPS daemon"; exit 2; }
trap 'echo quit | nvidia-cuda-mps-control' EXIT
git apply -R $P || exit 2
timeout 400 python3 results/shared_1xH100/84_e2m1_pairs/tp2_check.py > $R/check.log 2>&1; echo "=== exit $?"
git apply $P
tar czf "$OUT/$R.tgz" $R
grep -E "reference|Error" $R/check.log | cut -c1-400
