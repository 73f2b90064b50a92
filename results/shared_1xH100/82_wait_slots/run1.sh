#!/usr/bin/env bash
# Run 82, call 1, one H100 shared by 2 ranks under MPS: the waits' and stores' loops over the
# sources end after the last one in use (wait_slots.patch, in the checkout) timed against main
# (81's run6.sh: main, the patch, main again; main built here), then ncu of the same-bytes cases
# with the patch (instruction counts beside run 81's call 9).
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache
BENCHES="ops transitions quant" LAYOUTS=dp2,tp2 TOKENS=1,16,128,256,512 SIZES=2K,32K,128K,512K,4M \
    PATCH=results/shared_1xH100/82_wait_slots/wait_slots.patch R=call_1 \
    bash results/shared_1xH100/81_quant_floor/run6.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD/src
timeout 150 python3 scripts/ncu_profile.py --share-gpus --world 2 --stalls --cases "same bytes" \
    --out call_1/ncu_stalls > call_1/ncu_stalls.log 2>&1
tar czf "$OUT/call_1b.tgz" call_1
grep -E "^  void|inst_executed" call_1/ncu_stalls/ncu_rank0.txt
