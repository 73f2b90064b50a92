#!/usr/bin/env bash
# 2x H200, call 6: are our kernels confined to a green context's SMs when issued on its stream,
# as the README now advises with NCCL process groups? scripts/green_context_probe.py --on-stream,
# NCCL world of 2, green contexts of 8 SMs, table auto, DP2: without max_sms (grids of up to one
# block per SM of the GPU: confined to 8 SMs they cannot all be resident, so calls with many rows
# should end in PeerTimeout, as on one shared H100 in runs 17-21 of results/shared_1xH100), then
# with max_sms=8 (every call should match the reference).
set -u
source scripts/device_call.sh; new_call ${RUN:-6}
timeout 240 python3 scripts/green_context_probe.py --world 2 --sms 8 --on-stream --tables auto --attn-tp 1 \
  --timeout-s 3 > $R/probe_no_max_sms.log 2>&1
echo "=== probe without max_sms: exit $?"
timeout 120 python3 scripts/green_context_probe.py --world 2 --sms 8 --on-stream --tables auto --attn-tp 1 \
  --timeout-s 3 --max-sms 8 > $R/probe_max_sms_8.log 2>&1
echo "=== probe with max_sms 8: exit $?"
bring_back
cat $R/probe_no_max_sms.log $R/probe_max_sms_8.log
