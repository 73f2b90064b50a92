#!/usr/bin/env bash
# Run 84, call 11, one H100 shared by 2 ranks, the committed tree (the change, and sm_share at 24
# blocks a rank): call 9's TP2 benches again under MPS (do they finish now?), then ncu --sass of
# the nvfp4 Lamport gather at 256 tokens (no MPS: ncu serializes), where its instructions go now.
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
R=call_${RUN:-11}; mkdir -p $R .hc_cache/hybridcomm
for lib in .hc_cache/libs/*.xz; do [ -e "$lib" ] && xz -dc "$lib" > .hc_cache/hybridcomm/"$(basename "$lib" .xz)"; done
export CUDA_MPS_PIPE_DIRECTORY=/tmp/hc_mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/hc_mps_log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d || { echo "=== could not start the MPS daemon"; exit 2; }
i=0
for args in "--quant nvfp4 --tokens 1024" "--quant fp8,nvfp4 --tokens 1024" "--quant nvfp4 --tokens 512,1024"; do
  i=$((i + 1))
  timeout 100 python3 -m hybridcomm bench quant --world 2 --share-gpus --layouts tp2 --hidden 4096 $args \
      --out $R/bench_$i.json > $R/bench_$i.log 2>&1
  echo "=== $i: $args (exit $?)"; grep -E "^\[quant\] tp2|PeerTimeout:" $R/bench_$i.log | sort -u | cut -c1-200
done
echo quit | nvidia-cuda-mps-control
timeout 200 python3 scripts/ncu_profile.py --share-gpus --world 2 --stalls --sass --cases "256 tokens, DP, quant nvfp4" \
    --out $R/ncu_sass > $R/ncu_sass.log 2>&1; echo "=== ncu exit $?"
grep -E "^  void|inst_executed|cycles_active" $R/ncu_sass/ncu_rank0.txt
rm -f $R/ncu_sass/*.ncu-rep; gzip -f $R/ncu_sass/*.csv 2>/dev/null
tar czf "$OUT/$R.tgz" $R
