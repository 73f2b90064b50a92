#!/usr/bin/env bash
# Run 83, call 2, one H100 shared by 2 ranks under MPS: narrow_teams.patch timed against main
# (scripts/shared_gpu_timing.sh: main, the patch, main again; builds of our kernels compared, no
# NVLink, no baseline) -- the quantized gathers at hidden 4096 (nvfp4: narrow teams; fp8 and
# fp8_block128: unchanged, the control) and 2048 (every format narrow). Run 81's run6.sh does
# the work: the checkout holds the change, undone there so that "main" is main.
set -u
PATCH=results/shared_1xH100/83_narrow_teams/narrow_teams.patch R=call_${RUN:-2} \
  HIDDEN=${HIDDEN:-4096,2048} QUANTS=${QUANTS:-fp8,fp8_block128,nvfp4} TOKENS=${TOKENS:-1,16,128,256,512,1024} \
  BENCHES=${BENCHES:-quant} bash results/shared_1xH100/81_quant_floor/run6.sh
