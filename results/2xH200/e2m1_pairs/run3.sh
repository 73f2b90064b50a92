#!/usr/bin/env bash
# 2x H200, call 3: run1.sh's timing at DP2 and TP2 with two reverts, main before and after:
# revert_e2m1_pairs (its build carried) and revert_narrow_teams (83_narrow_teams: built here).
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache PYTHONPATH=$PWD/src
R=call_${RUN:-3}; mkdir -p $R .hc_cache/hybridcomm
for lib in .hc_cache/libs/*.xz; do [ -e "$lib" ] && xz -dc "$lib" > .hc_cache/hybridcomm/"$(basename "$lib" .xz)"; done
OUT=$R LAYOUTS=dp2,tp2 TOKENS=1,16,128,256,512 QUANTS=fp8,nvfp4 TESTS="tests/test_gpu_quant.py -k element_codes" \
  timeout 560 bash scripts/time_experiments.sh experiments/revert_e2m1_pairs.patch \
  experiments/revert_narrow_teams.patch > $R/timing.log 2>&1
echo "=== exit $?"
tar czf "$OUT/$R.tgz" $R
grep -E "^=== (build|bench|revert.*tests)" $R/timing.log
