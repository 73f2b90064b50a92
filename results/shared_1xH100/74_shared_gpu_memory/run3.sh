#!/usr/bin/env bash
# Run 74, calls 3 and 4, one H100, 8 ranks: the modules that ran out of memory or needed fresh
# workers before the fix, now with neither (one IPC share per peer; check.KEPT_ON_GPU).
# Call 3: bash run3.sh 3 (sm budget, fused Lamport); call 4: bash run3.sh 4 (bad counts, quant).
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
t="timeout 560 python3 -m pytest -v -p no:cacheprovider -m gpu --gpu-ranks 8"
if [ "$1" = 3 ]; then
    $t tests/test_gpu_sm_budget.py tests/test_gpu_fused_lamport.py > "$OUT/7_sm_budget_fused_world8.log" 2>&1
else
    $t tests/test_gpu_counts.py -k "different_counts or replicated_quantized or fused_gathers_given_bad" \
        tests/test_gpu_quant.py > "$OUT/8_counts_bad_quant_world8.log" 2>&1
fi
tail -n 4 "$OUT"/*.log
