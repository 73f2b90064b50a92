#!/usr/bin/env bash
# Run 84, call 5, one H100 shared by 2 ranks under MPS, main's build: `bench quant` at TP2 with
# 1024 tokens alone (does the PeerTimeout of call 3 need the sweep before it?), then
# tp2_probe.py --graphs (each algorithm timed as the bench does, one at a time).
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
P=results/shared_1xH100/84_e2m1_pairs/e2m1_pairs.patch
R=call_${RUN:-5}; mkdir -p $R .hc_cache/hybridcomm
for lib in .hc_cache/libs/*.xz; do [ -e "$lib" ] && xz -dc "$lib" > .hc_cache/hybridcomm/"$(basename "$lib" .xz)"; done
export CUDA_MPS_PIPE_DIRECTORY=/tmp/hc_mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/hc_mps_log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d || { echo "=== could not start the MPS daemon"; exit 2; }
trap 'echo quit | nvidia-cuda-mps-control' EXIT
git apply -R $P || exit 2
timeout 150 python3 -m hybridcomm bench quant --world 2 --share-gpus --layouts tp2 --quant fp8,nvfp4 --hidden 4096 \
    --tokens 1024 --out $R/bench_tp2_1024.json > $R/bench_tp2_1024.log 2>&1; echo "=== bench exit $?"
grep -E "^\[quant\]|PeerTimeout:" $R/bench_tp2_1024.log | cut -c1-220
timeout 250 python3 results/shared_1xH100/84_e2m1_pairs/tp2_probe.py --graphs ${TOKENS:-512 1024} > $R/probe_graphs.log 2>&1
git apply $P
tar czf "$OUT/$R.tgz" $R
grep -E " ok | ERROR " $R/probe_graphs.log
