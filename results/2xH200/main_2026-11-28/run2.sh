#!/usr/bin/env bash
# 2x H200, call 2: main's benchmarks at world 2, graph replays, every baseline in the same run:
# bench ops, bench transitions (dp2, tp2), bench quant (dp2, tp2, hidden 4096 and 7168), and the
# eager cost against torch.distributed (scripts/eager_profile.py, DP2 and TP2). Each bounded so
# the call ends inside the device's 10 minutes.
set -u
source scripts/device_call.sh; new_call ${RUN:-2}
DIR=$R; source scripts/steps.sh
step ops timeout 150 python3 -m hybridcomm bench ops --world 2 --out $R/ops_2xH200.json
step transitions timeout 170 python3 -m hybridcomm bench transitions --world 2 --layouts dp2,tp2 \
  --out $R/transitions_2xH200.json
step quant timeout 170 python3 -m hybridcomm bench quant --world 2 --layouts dp2,tp2 --hidden 4096,7168 \
  --tokens 1,16,64,128,256,512,1024 --out $R/quant_2xH200.json
step eager_dp2 timeout 40 python3 scripts/eager_profile.py --world 2 --no-profile --json $R/eager_dp2_2xH200.json
step eager_tp2 timeout 40 python3 scripts/eager_profile.py --world 2 --attn-tp 2 --no-profile \
  --json $R/eager_tp2_2xH200.json
bring_back
grep -h -A3 "ratio" $R/*.md 2>/dev/null | head -5
exit $status
