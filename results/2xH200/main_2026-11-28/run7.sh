#!/usr/bin/env bash
# 2x H200, call 7: call 3's green_context_stages.py again, now also timing a 1 GiB copy (torch's
# elementwise kernel, launched with <<<>>> as our launchers launch ours) on torch's current stream
# and on the green context's stream: whether kernels launched that way run on the green SMs only
# (call 6: on two GPUs our calls completed on the green stream even without max_sms, so the
# calls themselves do not show whether they were confined).
set -u
source scripts/device_call.sh; new_call ${RUN:-7}
timeout 150 python3 scripts/green_context_stages.py --world 2 --sms 8 > $R/green_context_stages.log 2>&1
echo "=== green_context_stages exit $?"
bring_back
cat $R/green_context_stages.log
