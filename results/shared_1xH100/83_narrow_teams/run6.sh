#!/usr/bin/env bash
# Run 83, call 16, one H100 shared by 2 ranks: the final sources (7c2b5a7: teams of 128, 256 and
# 512), built on the device, through run1.sh's tests and checks (the quantized gathers' GPU
# tests and `check --quick` on the auto, lamport and quant_ll tables).
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache PYTHONPATH=$PWD/src
mkdir -p call_16
( time python3 -m hybridcomm build ) > call_16/build.log 2>&1
RUN=16 bash results/shared_1xH100/83_narrow_teams/run1.sh
