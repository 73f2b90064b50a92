#!/usr/bin/env bash
# Run 81, call 9, one H100 shared by 2 ranks: ncu's instruction counts and stall reasons of the
# same-bytes cases (call 1's) with the receive-loop change in the checkout, to set beside call 1's.
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
R=call_9; mkdir -p $R .hc_cache/hybridcomm
for lib in .hc_cache/libs/*.xz; do xz -dc "$lib" > .hc_cache/hybridcomm/"$(basename "$lib" .xz)"; done
timeout 150 python3 scripts/ncu_profile.py --share-gpus --world 2 --stalls --cases "same bytes" \
    --out $R/13_ncu_stalls > $R/13_ncu_stalls.log 2>&1
tar czf "$OUT/$R.tgz" $R
grep -E "^  void|inst_executed|cycles_active" $R/13_ncu_stalls/ncu_rank0.txt
