#!/usr/bin/env bash
# Run 84, call 9, one H100 shared by 2 ranks under MPS, the change's build: does call 5's 1,389 us
# (TP2 nvfp4 hidden 4096, 1024 tokens, the LL quantized kernel, under `bench quant`) come back,
# and what does it need? The same bench three ways: nvfp4 alone, fp8 then nvfp4 (call 5), and
# again; then with 512 tokens before.
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
R=call_${RUN:-9}; mkdir -p $R .hc_cache/hybridcomm
for lib in .hc_cache/libs/*.xz; do [ -e "$lib" ] && xz -dc "$lib" > .hc_cache/hybridcomm/"$(basename "$lib" .xz)"; done
export CUDA_MPS_PIPE_DIRECTORY=/tmp/hc_mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/hc_mps_log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d || { echo "=== could not start the MPS daemon"; exit 2; }
trap 'echo quit | nvidia-cuda-mps-control' EXIT
i=0
for args in "--quant nvfp4 --tokens 1024" "--quant fp8,nvfp4 --tokens 1024" "--quant fp8,nvfp4 --tokens 1024" \
            "--quant nvfp4 --tokens 512,1024"; do
  i=$((i + 1))
  timeout 100 python3 -m hybridcomm bench quant --world 2 --share-gpus --layouts tp2 --hidden 4096 $args \
      --out $R/bench_$i.json > $R/bench_$i.log 2>&1
  echo "=== $i: $args (exit $?)"; grep -E "^\[quant\] tp2|PeerTimeout:" $R/bench_$i.log | cut -c1-200
done
tar czf "$OUT/$R.tgz" $R
