#!/usr/bin/env bash
# 2x H200, call 1: main's GPU tests (every file marked gpu, NCCL's included) and
# `hybridcomm check --world 2 --device cuda`, on main's library built on the CPU machine and
# carried in .hc_cache (nothing compiled there).
set -u
source scripts/device_call.sh; new_call ${RUN:-1}
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpus.txt
ls $XDG_CACHE_HOME/hybridcomm > $R/library.txt
OUT=$R timeout ${GPU_CHECK_TIMEOUT:-520} bash scripts/gpu_check.sh info build test check > $R/gpu_check.log 2>&1
echo "=== gpu_check exit $?"
bring_back
grep -E "^=== |passed|failed|PASS|FAIL" $R/gpu_check.log | tail -20
