#!/usr/bin/env bash
# Run 85, call 1, one GPU shared by 2 ranks (correctness only): experiments/ll_teams_of_512.patch
# (the LL quantized kernel back to row teams of 512; the Lamport kernel keeps its narrow teams)
# through the GPU tests of the quantized gathers -- LL and Lamport, counts given and own, row
# teams (41 rows; 256-row graphs replayed with new counts at every narrow width), the fused
# Lamport gather -- and `check --quick` on the auto, lamport and quant_ll tables. The patched
# build travels xz-compressed.
set -u
source scripts/device_call.sh; new_call ${RUN:-1}
P=experiments/ll_teams_of_512.patch
git apply $P || exit 2
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpus.txt
python3 -c 'from hybridcomm import build; print(build.library_name("90a"))' > $R/library.txt
ls .hc_cache/hybridcomm >> $R/library.txt
timeout ${TEST_TIMEOUT:-400} python3 -m pytest -v -p no:cacheprovider -m gpu --gpu-ranks 2 \
    ${GPU_TESTS:-tests/test_gpu_row_teams.py tests/test_gpu_quant.py tests/test_gpu_lamport_quant.py \
    tests/test_gpu_counts.py tests/test_gpu_fused_lamport.py} > $R/tests_world2.log 2>&1
for table in auto lamport quant_ll; do
  timeout 60 python3 -m hybridcomm check --world 2 --device cuda --share-gpus --quick --table $table \
      > $R/check_$table.log 2>&1
done
git apply -R $P
bring_back
cat $R/library.txt
grep -E "FAILED|ERROR|Timeout" $R/tests_world2.log | head -20
tail -n 3 $R/*.log
