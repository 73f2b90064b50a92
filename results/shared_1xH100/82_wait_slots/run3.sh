#!/usr/bin/env bash
# Run 82, call 3, one H100 shared by 2 ranks (correctness only): received_slots.patch (in the
# checkout) through the tests of the kernels it touches -- all_gather_v and the transitions on LL
# and Lamport, the LL two-shot all_reduce: test_gpu.py (every op and forced algorithm, 1000-replay
# graphs) and test_gpu_lamport.py, then `check --quick` on the auto, lamport and two_shot tables.
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
R=call_3; mkdir -p $R .hc_cache/hybridcomm
for lib in .hc_cache/libs/*.xz; do xz -dc "$lib" > .hc_cache/hybridcomm/"$(basename "$lib" .xz)"; done
timeout 400 python3 -m pytest -v -p no:cacheprovider -m gpu --gpu-ranks 2 tests/test_gpu.py tests/test_gpu_lamport.py \
    > $R/tests_world2.log 2>&1
for table in auto lamport two_shot; do
  timeout 60 python3 -m hybridcomm check --world 2 --device cuda --share-gpus --quick --table $table \
      > $R/check_$table.log 2>&1
done
tar czf "$OUT/$R.tgz" $R
tail -n 2 $R/*.log
