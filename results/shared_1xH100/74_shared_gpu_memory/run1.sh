#!/usr/bin/env bash
# Run 74, call 1, on one H100 (ranks share it; correctness only): the shared-GPU memory test with
# the fix, then with the fix reversed (expected to fail), then tests not yet run since their last change.
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
here=results/shared_1xH100/74_shared_gpu_memory
t="python3 -m pytest -v -p no:cacheprovider -m gpu"
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/0_gpu.txt"
$t --gpu-ranks 4 tests/test_gpu_shared_memory.py > "$OUT/1_memory_world4.log" 2>&1
$t --gpu-ranks 8 tests/test_gpu_shared_memory.py > "$OUT/2_memory_world8.log" 2>&1
if patch -R -p1 < "$here/one_share_per_peer.patch" > "$OUT/3_reverted.patch.log" 2>&1; then
    $t --gpu-ranks 4 tests/test_gpu_shared_memory.py > "$OUT/3_memory_world4_fix_reversed.log" 2>&1
    patch -p1 < "$here/one_share_per_peer.patch" >> "$OUT/3_reverted.patch.log" 2>&1
fi
$t --gpu-ranks 8 tests/test_gpu_layout_rules.py tests/test_hf_gpu.py -k "layout_s_own or one_expert" \
    > "$OUT/4_layout_rules_hf_world8.log" 2>&1
tail -n 3 "$OUT"/*.log
