#!/usr/bin/env bash
# 2x H200, call 5: where the host time of the engines' fused-gather path goes (call 4 read ~25 µs
# of host time a call for its one-kernel norm, where a launch costs a few): scripts/eager_profile.py
# with --theirs (cProfile of both sides), TP2 and DP2; and the GPU test of the one-kernel norm
# (kernels.add_rms_norm now allocates with torch.empty instead of empty_like).
set -u
source scripts/device_call.sh; new_call ${RUN:-5}
DIR=$R; source scripts/steps.sh
step norm_tests timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_add_rms_norm.py
step eager_tp2 timeout 90 python3 scripts/eager_profile.py --world 2 --attn-tp 2 --theirs --top 14 \
  --json $R/eager_tp2_2xH200.json
step eager_dp2 timeout 90 python3 scripts/eager_profile.py --world 2 --theirs --top 14 --json $R/eager_dp2_2xH200.json
bring_back
tail -n 2 $R/norm_tests.log
sed -n '1,12p' $R/eager_tp2.log
awk '/## torch.distributed gather_tokens\+norm/,/## scatter_tokens/' $R/eager_tp2.log | head -30
awk '/## gather_tokens\+norm/,/## torch.distributed gather_tokens\+norm/' $R/eager_tp2.log | head -26
sed -n '1,12p' $R/eager_dp2.log
exit $status
