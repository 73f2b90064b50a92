#!/usr/bin/env bash
# Run 82, calls 1 and 2, one H100 shared by 2 ranks under MPS: a change to the loops over the
# sources after a wait (PATCH, in the checkout) timed against main (81's run6.sh: main, the patch,
# main again), then ncu of the same-bytes cases with it (instruction counts beside run 81's).
#   call 1: CALL=1 PATCH=wait_slots.patch BENCHES="ops transitions quant" (both loops stop after
#           the last source; main built on the device)
#   call 2: CALL=2 PATCH=received_slots.patch BENCHES="ops transitions" (the store loops only; both
#           builds carried xz-compressed)
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache
C=call_$CALL
BENCHES=$BENCHES LAYOUTS=dp2,tp2 TOKENS=1,16,128,256,512 SIZES=2K,32K,128K,512K,4M \
    PATCH=results/shared_1xH100/82_wait_slots/$PATCH R=$C \
    bash results/shared_1xH100/81_quant_floor/run6.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD/src
timeout 150 python3 scripts/ncu_profile.py --share-gpus --world 2 --stalls --cases "same bytes" \
    --out $C/ncu_stalls > $C/ncu_stalls.log 2>&1
tar czf "$OUT/${C}b.tgz" $C
grep -E "^  void|inst_executed" $C/ncu_stalls/ncu_rank0.txt
