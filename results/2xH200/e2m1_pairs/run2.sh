#!/usr/bin/env bash
# 2x H200, call 2: the committed tree's quantized-gather GPU tests on two real GPUs (NCCL's
# included), as run 83's run1.sh lists them, and `check --quick` on three tables at world 2.
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
R=call_${RUN:-2}; mkdir -p $R .hc_cache/hybridcomm
for lib in .hc_cache/libs/*.xz; do [ -e "$lib" ] && xz -dc "$lib" > .hc_cache/hybridcomm/"$(basename "$lib" .xz)"; done
timeout 420 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_gpu_row_teams.py tests/test_gpu_quant.py \
    tests/test_gpu_lamport_quant.py tests/test_gpu_counts.py tests/test_gpu_fused_lamport.py > $R/tests_world2.log 2>&1
for table in auto lamport quant_ll; do
  timeout 60 python3 -m hybridcomm check --world 2 --device cuda --quick --table $table > $R/check_$table.log 2>&1
done
tar czf "$OUT/$R.tgz" $R
grep -E "FAILED|ERROR|Timeout" $R/tests_world2.log | head -20; tail -n 2 $R/tests_world2.log $R/check_*.log
