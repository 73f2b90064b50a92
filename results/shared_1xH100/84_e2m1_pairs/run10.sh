#!/usr/bin/env bash
# Run 84, call 10, one H100 shared by 2 ranks under MPS, the change's build: is call 9's stall
# (TP2 nvfp4 1024 tokens under `bench quant`) PDL's? With PDL a rank's next kernel becomes resident
# while its current one runs; two ranks x two kernels x the SM budget (49 blocks) exceed the 132
# SMs, so a rank's kernel may not get all its blocks resident while its peer's waits for it.
# A: PDL off (nvlink.py's default, edited here only), the budget as it is. B: PDL on, half the
# budget (bench/shared.py sm_share: 3/8 of the even split instead of 3/4). Each as call 9's benches.
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
R=call_${RUN:-10}; mkdir -p $R .hc_cache/hybridcomm
for lib in .hc_cache/libs/*.xz; do [ -e "$lib" ] && xz -dc "$lib" > .hc_cache/hybridcomm/"$(basename "$lib" .xz)"; done
export CUDA_MPS_PIPE_DIRECTORY=/tmp/hc_mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/hc_mps_log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d || { echo "=== could not start the MPS daemon"; exit 2; }
trap 'echo quit | nvidia-cuda-mps-control; git checkout -- src/hybridcomm' EXIT
benches() {  # benches VARIANT
  local i=0 args
  for args in "--quant nvfp4 --tokens 1024" "--quant fp8,nvfp4 --tokens 1024" "--quant nvfp4 --tokens 512,1024"; do
    i=$((i + 1))
    timeout 100 python3 -m hybridcomm bench quant --world 2 --share-gpus --layouts tp2 --hidden 4096 $args \
        --out $R/$1_$i.json > $R/$1_$i.log 2>&1
    echo "=== $1 $i: $args (exit $?)"; grep -E "^\[quant\] tp2|PeerTimeout:" $R/$1_$i.log | sort -u | cut -c1-200
  done
}
sed -i 's/^PDL = True/PDL = False/' src/hybridcomm/backends/nvlink.py && grep -n "^PDL" src/hybridcomm/backends/nvlink.py
benches pdl_off
git checkout -- src/hybridcomm
sed -i 's|sms // ranks_per_gpu(world_size) \* 3 // 4|sms // ranks_per_gpu(world_size) * 3 // 8|' src/hybridcomm/bench/shared.py
grep -n "3 // 8" src/hybridcomm/bench/shared.py
benches half_budget
tar czf "$OUT/$R.tgz" $R
