#!/usr/bin/env bash
# Run 81, call 2, one H100 shared by 2 ranks: is fp8 Lamport at 512 tokens (52.8 us in call 1, 29.4
# in run 79) slow again, with the sweep's capacity at 512 tokens and at 1024? Then ncu's full set of
# the fp8 256-token Lamport gather and the bf16 128-token one (the same bytes), tarred.
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
(
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/hc_mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/hc_mps_log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d || { echo "=== could not start the MPS daemon"; exit 2; }
  trap 'echo quit | nvidia-cuda-mps-control' EXIT
  q="python3 -m hybridcomm bench quant --world 2 --share-gpus --layouts dp2 --quant fp8 --hidden 4096"
  timeout 120 $q --tokens 256,512 --out "$OUT/4_fp8_cap512.json" > "$OUT/4_fp8_cap512.log" 2>&1
  timeout 120 $q --tokens 256,512,1024 --out "$OUT/5_fp8_cap1024.json" > "$OUT/5_fp8_cap1024.log" 2>&1
  timeout 120 $q --tokens 256,512 --out "$OUT/6_fp8_cap512_again.json" > "$OUT/6_fp8_cap512_again.log" 2>&1
)
timeout 150 python3 scripts/ncu_profile.py --share-gpus --world 2 --cases "same bytes" \
    --out ncu_full > "$OUT/7_ncu_full.log" 2>&1
tar czf "$OUT/7_ncu_full.tgz" ncu_full
grep -h "512,512\|1024,1024\|256,256" "$OUT"/*.md
tail -n 2 "$OUT"/*.log
