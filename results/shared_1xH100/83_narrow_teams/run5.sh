#!/usr/bin/env bash
# Run 83, call 14, one H100 shared by 2 ranks under MPS: the 128-thread teams as committed
# (teams_of_128_committed.patch: 02d5405 -> b3c7040) against the 256-thread teams at hidden 4096,
# where no row changes team. With the 128 step every instance of lamport_quant_gather.cu got
# slightly different machine code (README, "Machine code"): this times whether that costs
# anything. Through run 81's run6.sh (both builds carried xz-compressed).
set -u
PATCH=results/shared_1xH100/83_narrow_teams/teams_of_128_committed.patch R=call_${RUN:-14} HIDDEN=4096 \
  QUANTS=fp8,fp8_block128,nvfp4 TOKENS=1,16,128,256,512,1024 BENCHES=quant \
  bash results/shared_1xH100/81_quant_floor/run6.sh
