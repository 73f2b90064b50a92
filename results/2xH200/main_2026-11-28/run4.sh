#!/usr/bin/env bash
# 2x H200, call 4: (1) tests/test_gpu_sm_budget.py with the green-context test's calls on the
# green context's own stream (call 1's failure; call 3's stages); (2) the eager cost with the fused
# gather's baseline now what engines launch (all_gather + the one-kernel residual add + RMSNorm,
# all_reduce first at TP2); (3) time_experiments.sh with experiments/fp8_split_teams_of_256_ll.patch
# (call 3's split for the LL quantized kernel only; the Lamport kernel keeps main's grid), DP2,
# main before and after, and the row-team and quantized-gather GPU tests with it applied.
set -u
source scripts/device_call.sh; new_call ${RUN:-4}
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_sm_budget.py \
  > $R/tests_sm_budget.log 2>&1
echo "=== sm_budget tests exit $?"
DIR=$R; source scripts/steps.sh
step eager_dp2 timeout 40 python3 scripts/eager_profile.py --world 2 --no-profile --json $R/eager_dp2_2xH200.json
step eager_tp2 timeout 40 python3 scripts/eager_profile.py --world 2 --attn-tp 2 --no-profile \
  --json $R/eager_tp2_2xH200.json
OUT=$R LAYOUTS=dp2 TOKENS=1,2,4,8,16,128,256 QUANTS=fp8,nvfp4 \
  TESTS="tests/test_gpu_row_teams.py tests/test_gpu_quant.py tests/test_gpu_lamport_quant.py" \
  timeout 260 bash scripts/time_experiments.sh experiments/fp8_split_teams_of_256_ll.patch > $R/timing.log 2>&1
echo "=== timing exit $?"
bring_back
tail -n 3 $R/tests_sm_budget.log
cat $R/eager_dp2.log $R/eager_tp2.log
cat $R/timing.log
