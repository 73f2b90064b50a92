#!/usr/bin/env bash
# Run 81, call 10, one H100 shared by 2 ranks: call 4's per-SASS-instruction profile of the fp8
# same-bytes case again, with the receive-loop change, to see where the predicted savings went.
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
R=call_10; mkdir -p $R .hc_cache/hybridcomm
for lib in .hc_cache/libs/*.xz; do xz -dc "$lib" > .hc_cache/hybridcomm/"$(basename "$lib" .xz)"; done
timeout 200 python3 scripts/ncu_profile.py --share-gpus --world 2 --sass --cases "256 tokens" --out $R/14_ncu_sass \
    > $R/14_ncu_sass.log 2>&1
rm -f $R/14_ncu_sass/*.ncu-rep; gzip -9 $R/14_ncu_sass/sass_rank0.csv
tar czf "$OUT/$R.tgz" $R
grep -E "^  void|Executed Instructions  " $R/14_ncu_sass/ncu_rank0.txt
