#!/usr/bin/env bash
# Run 83, calls 11-12, one H100 shared by 2 ranks: 128-thread teams for plain rows of at most 128
# data lanes (teams_of_128.patch, in the checkout) -- call 11: test_gpu_row_teams.py; call 12:
# main (256-thread teams there since narrow_teams.patch) / the patch / main with `bench quant`
# DP2 at hidden 2048 (nvfp4: 128 lanes) and 1024 (the fp8 formats: 128 lanes), through run 81's
# run6.sh (both builds carried xz-compressed).
set -u
if [ "${RUN:-11}" = 11 ]; then
  RUN=11 GPU_TESTS="tests/test_gpu_row_teams.py" bash results/shared_1xH100/83_narrow_teams/run1.sh
else
  PATCH=results/shared_1xH100/83_narrow_teams/teams_of_128.patch R=call_$RUN HIDDEN=${HIDDEN:-2048,1024} \
    QUANTS=${QUANTS:-fp8,fp8_block128,nvfp4} TOKENS=${TOKENS:-1,16,128,256,512,1024} BENCHES=quant \
    bash results/shared_1xH100/81_quant_floor/run6.sh
fi
