#!/usr/bin/env bash
# Run 81, calls 5 and 11, one H100 shared by 2 ranks (correctness only): the receive-loop change
# (receive_loop.patch, in the checkout; call 5 its first version, call 11 the final one) through
# the GPU tests of the kernels it touches -- the quantized gathers (LL and Lamport, counts given
# and own, row teams), the fused Lamport gather -- and `check` on the auto, lamport and quant_ll
# tables (every op). GPU_TESTS replaces the test files (call 12: the Lamport row ops' re-fill).
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
R=call_${RUN:-5}; mkdir -p $R .hc_cache/hybridcomm
for lib in .hc_cache/libs/*.xz; do [ -e "$lib" ] && xz -dc "$lib" > .hc_cache/hybridcomm/"$(basename "$lib" .xz)"; done
t="python3 -m pytest -v -p no:cacheprovider -m gpu --gpu-ranks 2"
timeout ${TEST_TIMEOUT:-330} $t ${GPU_TESTS:-tests/test_gpu_quant.py tests/test_gpu_lamport_quant.py \
    tests/test_gpu_fused_lamport.py tests/test_gpu_row_teams.py tests/test_gpu_counts.py} > $R/11_tests_world2.log 2>&1
[ -n "${GPU_TESTS:-}" ] || for table in lamport quant_ll auto; do
  timeout 60 python3 -m hybridcomm check --world 2 --device cuda --share-gpus --quick --table $table \
      > $R/12_check_$table.log 2>&1
done
tar czf "$OUT/$R.tgz" $R
tail -n 3 $R/*.log
