#!/usr/bin/env bash
# 2x H200, call 4: call 3 read the narrow row teams (83_narrow_teams) 1.14-1.21x slower than their
# revert for nvfp4 DP2 at 256 tokens (LL), 0.78-0.82x at 512 (Lamport). Twice more, DP2 only:
# main, revert_narrow_teams, main (its build carried this time, beside main's). nvfp4 at 7168
# (448 lanes: teams of 512 either way) and fp8 at 4096 (512 lanes) are unchanged by it: controls.
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache PYTHONPATH=$PWD/src
mkdir -p .hc_cache/hybridcomm
for lib in .hc_cache/libs/*.xz; do [ -e "$lib" ] && xz -dc "$lib" > .hc_cache/hybridcomm/"$(basename "$lib" .xz)"; done
for R in call_4a call_4b; do
  mkdir -p $R
  OUT=$R LAYOUTS=dp2 TOKENS=1,16,128,256,512 QUANTS=fp8,nvfp4 TESTS="tests/test_gpu_quant.py -k element_codes" \
    timeout 280 bash scripts/time_experiments.sh experiments/revert_narrow_teams.patch > $R/timing.log 2>&1
  echo "=== $R exit $?"; grep -E "^=== (build|bench|revert.*tests)" $R/timing.log
  tar czf "$OUT/$R.tgz" $R
done
