#!/usr/bin/env bash
# 2x H200 (NVLink; multicast off), 2026-11-24 night, call 1: the packed e2m1 codes (86e7124) timed
# on NVLink. scripts/time_experiments.sh with experiments/revert_e2m1_pairs.patch: main, the
# revert (the codes as seven fp32 comparisons a value), main again; bench quant DP2, fp8 and nvfp4,
# hidden 4096 and 7168, 1-512 tokens, with the NCCL baselines. Both builds travel xz-compressed
# (main's = this tree's, the revert's = 596cc7d's kernels). With the revert applied, the exhaustive
# element-code test runs (the old code on this GPU).
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache PYTHONPATH=$PWD/src
R=call_${RUN:-1}; mkdir -p $R .hc_cache/hybridcomm
for lib in .hc_cache/libs/*.xz; do [ -e "$lib" ] && xz -dc "$lib" > .hc_cache/hybridcomm/"$(basename "$lib" .xz)"; done
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpus.txt
OUT=$R LAYOUTS=${LAYOUTS:-dp2} TOKENS=${TOKENS:-1,16,128,256,512} QUANTS=fp8,nvfp4 \
  TESTS="tests/test_gpu_quant.py -k element_codes" \
  timeout 560 bash scripts/time_experiments.sh experiments/revert_e2m1_pairs.patch > $R/timing.log 2>&1
echo "=== exit $?"
tar czf "$OUT/$R.tgz" $R
grep -A14 "=== revert_e2m1_pairs" $R/timing.log | head -40
