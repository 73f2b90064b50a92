#!/usr/bin/env bash
# Run 81, call 3, one H100 shared by 2 ranks: does a quantized gather's time follow its rows or its
# bytes? The same input and quantized bytes as hidden 4096 x T tokens at hidden 8192 x T/2: a
# 4096-wide nvfp4 row (256 wire lanes) leaves half of a 512-thread row team idle, an 8192-wide one
# (512 lanes) none. Then ncu's full set of the same-bytes cases. Everything in one archive (the
# device tool brings back ~8 files).
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
R=call_3; mkdir -p $R
(
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/hc_mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/hc_mps_log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d || { echo "=== could not start the MPS daemon"; exit 2; }
  trap 'echo quit | nvidia-cuda-mps-control' EXIT
  q="python3 -m hybridcomm bench quant --world 2 --share-gpus --layouts dp2 --quant fp8,fp8_block128,nvfp4"
  timeout 200 $q --hidden 4096,8192 --tokens 32,64,128,256,512 --out $R/8_rows_or_bytes.json > $R/8_rows_or_bytes.log 2>&1
)
timeout 150 python3 scripts/ncu_profile.py --share-gpus --world 2 --cases "same bytes" --out $R/9_ncu_full \
    > $R/9_ncu_full.log 2>&1
tar czf "$OUT/call_3.tgz" $R
grep -h "^## \|balanced" $R/8_rows_or_bytes.md
tail -n 2 $R/*.log
