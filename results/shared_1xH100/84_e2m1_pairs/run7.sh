#!/usr/bin/env bash
# Run 84, call 7, one H100 shared by 2 ranks under MPS, main's build: tp2_probe.py --graphs at
# 1024 tokens with the workspace of call 5's bench (1024 x 4096), then again with call 3's
# (1024 x 7168): does the workspace size make the LL quantized gather's 1389 us?
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
P=results/shared_1xH100/84_e2m1_pairs/e2m1_pairs.patch
R=call_${RUN:-7}; mkdir -p $R .hc_cache/hybridcomm
for lib in .hc_cache/libs/*.xz; do [ -e "$lib" ] && xz -dc "$lib" > .hc_cache/hybridcomm/"$(basename "$lib" .xz)"; done
export CUDA_MPS_PIPE_DIRECTORY=/tmp/hc_mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/hc_mps_log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d || { echo "=== could not start the MPS daemon"; exit 2; }
trap 'echo quit | nvidia-cuda-mps-control' EXIT
git apply -R $P || exit 2
i=0
for h in 4096 7168 4096; do
  i=$((i + 1))
  timeout 150 python3 results/shared_1xH100/84_e2m1_pairs/tp2_probe.py --graphs --hidden-area $h 1024 \
      > $R/probe_${i}_area_$h.log 2>&1
  grep -E "workspace| ok | ERROR " $R/probe_${i}_area_$h.log
done
git apply $P
tar czf "$OUT/$R.tgz" $R
