#!/usr/bin/env bash
# 2x H200, call 3: (1) scripts/green_context_stages.py: which step makes a green context stop
# being current with NCCL process groups (call 1's one failure); (2) time_experiments.sh with
# experiments/fp8_split_teams_of_256.patch (fp8 rows of up to 2048 input lanes in two blocks of
# 256: DP2 fp8 at hidden 7168 changes; hidden 4096 and nvfp4 are the controls), main before and
# after, and the row-team and quantized-gather GPU tests with the patch applied. Both builds
# carried xz-compressed in .hc_cache/libs (device_call.sh unpacks them).
set -u
source scripts/device_call.sh; new_call ${RUN:-3}
timeout 120 python3 scripts/green_context_stages.py --world 2 --sms 8 > $R/green_context_stages.log 2>&1
echo "=== green_context_stages exit $?"
OUT=$R LAYOUTS=dp2 TOKENS=1,2,4,8,16,128,256 QUANTS=fp8,nvfp4 \
  TESTS="tests/test_gpu_row_teams.py tests/test_gpu_quant.py tests/test_gpu_lamport_quant.py" \
  timeout 420 bash scripts/time_experiments.sh experiments/fp8_split_teams_of_256.patch > $R/timing.log 2>&1
echo "=== timing exit $?"
bring_back
cat $R/green_context_stages.log
cat $R/timing.log
