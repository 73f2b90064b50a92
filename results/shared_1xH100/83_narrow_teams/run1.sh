#!/usr/bin/env bash
# Run 83, call 1, one H100 shared by 2 ranks (correctness only): narrow_teams.patch (in the
# checkout: 256-thread row teams for plain rows of at most 256 data lanes, two a block, each at
# its own named barrier) through the GPU tests of the quantized gathers -- LL and Lamport, counts
# given and own, row teams (41 rows: a block's two teams work different numbers of rows; graphs
# of 300-row capacity replayed with new counts), the fused Lamport gather -- and `check --quick`
# on the auto, lamport and quant_ll tables. Both builds travel xz-compressed (run 81's run6.sh).
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
R=call_${RUN:-1}; mkdir -p $R .hc_cache/hybridcomm
for lib in .hc_cache/libs/*.xz; do [ -e "$lib" ] && xz -dc "$lib" > .hc_cache/hybridcomm/"$(basename "$lib" .xz)"; done
t="python3 -m pytest -v -p no:cacheprovider -m gpu --gpu-ranks 2"
timeout ${TEST_TIMEOUT:-400} $t ${GPU_TESTS:-tests/test_gpu_row_teams.py tests/test_gpu_quant.py \
    tests/test_gpu_lamport_quant.py tests/test_gpu_counts.py tests/test_gpu_fused_lamport.py} > $R/tests_world2.log 2>&1
[ -n "${GPU_TESTS:-}" ] || for table in auto lamport quant_ll; do
  timeout 60 python3 -m hybridcomm check --world 2 --device cuda --share-gpus --quick --table $table \
      > $R/check_$table.log 2>&1
done
tar czf "$OUT/$R.tgz" $R
grep -E "FAILED|ERROR|Timeout" $R/tests_world2.log | head -20
tail -n 3 $R/*.log
