#!/usr/bin/env bash
# Run 84, call 12, one H100, the committed tree: ncu --sass (the source page with every SASS
# instruction's executions) of the nvfp4 Lamport gathers at 256 and 512 tokens, DP2 hidden 4096,
# 24 blocks a rank: where the quantized kernel's instructions go after the packed codes.
# (Call 11's --stalls --sass page had no executions, and its cases matched every DP case.)
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
R=call_${RUN:-12}; mkdir -p $R .hc_cache/hybridcomm
for lib in .hc_cache/libs/*.xz; do [ -e "$lib" ] && xz -dc "$lib" > .hc_cache/hybridcomm/"$(basename "$lib" .xz)"; done
timeout 400 python3 scripts/ncu_profile.py --share-gpus --world 2 --sass --cases "nvfp4 Lamport" \
    --out $R/ncu_sass > $R/ncu_sass.log 2>&1; echo "=== ncu exit $?"
grep -E "^  void|Executed Instructions  |Duration" $R/ncu_sass/ncu_rank0.txt | head
rm -f $R/ncu_sass/*.ncu-rep; gzip -f $R/ncu_sass/*.csv 2>/dev/null
tar czf "$OUT/$R.tgz" $R
