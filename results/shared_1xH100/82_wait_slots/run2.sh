#!/usr/bin/env bash
# Run 82, call 2, one H100 shared by 2 ranks under MPS: call 1's change without its poll-loop
# part (which made the LL fused gather spill): only the store loops after a wait end after the
# last source (received_slots.patch, in the checkout). Timed against main (81's run6.sh; both
# builds carried xz-compressed), then ncu of the same-bytes cases with it.
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache
BENCHES="ops transitions" LAYOUTS=dp2,tp2 TOKENS=1,16,128,256,512 SIZES=2K,32K,128K,512K,4M \
    PATCH=results/shared_1xH100/82_wait_slots/received_slots.patch R=call_2 \
    bash results/shared_1xH100/81_quant_floor/run6.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD/src
timeout 150 python3 scripts/ncu_profile.py --share-gpus --world 2 --stalls --cases "same bytes" \
    --out call_2/ncu_stalls > call_2/ncu_stalls.log 2>&1
tar czf "$OUT/call_2b.tgz" call_2
grep -E "^  void|inst_executed" call_2/ncu_stalls/ncu_rank0.txt
