#!/usr/bin/env bash
# Run 74, call 2, one H100: the layout-rules test at world 4 (world 8 has no layout rules: it skips
# there), then test_gpu_counts.py's bad-count cases at world 8 (the "differ" case's fix, not run since).
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
t="python3 -m pytest -v -p no:cacheprovider -m gpu"
$t --gpu-ranks 4 tests/test_gpu_layout_rules.py > "$OUT/5_layout_rules_world4.log" 2>&1
timeout 480 $t --gpu-ranks 8 tests/test_gpu_counts.py \
    -k "different_counts or replicated_quantized or fused_gathers_given_bad" > "$OUT/6_counts_bad_world8.log" 2>&1
tail -n 3 "$OUT"/*.log
