#!/usr/bin/env bash
# Run 81, calls 6 and 7, one H100 shared by 2 ranks under MPS: the receive-loop change timed
# against main (scripts/shared_gpu_timing.sh: main, the patch, main again; a comparison of two
# builds of our kernels, no NVLink). The checkout holds the change: undone first, so that
# "main" is main; the patch's build is carried, main's is built here (call 6: 242 s) or, from
# call 7 on, both builds travel xz-compressed in .hc_cache/libs (two plain builds and the tree
# exceed what may travel) and are unpacked here. BENCHES picks the benches (call 6: quant).
# Run 82 reuses it for its own patch: PATCH (default: this run's) and R (default: call_RUN).
set -u
P=${PATCH:-results/shared_1xH100/81_quant_floor/receive_loop.patch}
R=${R:-call_${RUN:-6}}; mkdir -p $R .hc_cache/hybridcomm
command -v xz > /dev/null || { echo "=== no xz here"; exit 2; }
for lib in .hc_cache/libs/*.xz; do [ -e "$lib" ] && xz -dc "$lib" > .hc_cache/hybridcomm/"$(basename "$lib" .xz)"; done
git apply -R $P || { echo "=== the patch does not undo"; exit 2; }
export XDG_CACHE_HOME=$PWD/.hc_cache
OUT=$R LAYOUTS=${LAYOUTS:-dp2} TOKENS=${TOKENS:-1,16,128,256,512} QUANTS=${QUANTS:-fp8,nvfp4} \
    bash scripts/shared_gpu_timing.sh $P > $R/timing.log 2>&1
git apply $P
tar czf "$OUT/$R.tgz" $R
grep -A12 "===.*against" $R/timing.log | head -80
