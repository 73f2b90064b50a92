#!/usr/bin/env bash
# Run 84, call 4, one H100 shared by 2 ranks under MPS: tp2_probe.py (which TP2 quantized gather
# times out at 1024 tokens), on main's build and on the change's.
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
P=results/shared_1xH100/84_e2m1_pairs/e2m1_pairs.patch
R=call_${RUN:-4}; mkdir -p $R .hc_cache/hybridcomm
for lib in .hc_cache/libs/*.xz; do [ -e "$lib" ] && xz -dc "$lib" > .hc_cache/hybridcomm/"$(basename "$lib" .xz)"; done
export CUDA_MPS_PIPE_DIRECTORY=/tmp/hc_mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/hc_mps_log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d || { echo "=== could not start the MPS daemon"; exit 2; }
trap 'echo quit | nvidia-cuda-mps-control' EXIT
timeout 280 python3 results/shared_1xH100/84_e2m1_pairs/tp2_probe.py ${TOKENS:-512 768 1024} > $R/probe_change.log 2>&1
git apply -R $P && {
  timeout 200 python3 results/shared_1xH100/84_e2m1_pairs/tp2_probe.py ${TOKENS:-512 768 1024} > $R/probe_main.log 2>&1
  git apply $P; }
tar czf "$OUT/$R.tgz" $R
grep -v Warning $R/probe_change.log | grep -v "^ *super\|warn" | tail -40
echo "=== main"; grep -E "ERROR|Error" $R/probe_main.log | head
