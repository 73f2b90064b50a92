#!/usr/bin/env bash
# Run 84, call 2, one H100 shared by 2 ranks under MPS: e2m1_pairs.patch timed against main
# (main, the change, main again; run 81's run6.sh, both builds carried xz-compressed). fp8 is the
# control beside hc_bf16: its instances do not call the e2m1 code.
set -u
PATCH=results/shared_1xH100/84_e2m1_pairs/e2m1_pairs.patch R=call_${RUN:-2} LAYOUTS=${LAYOUTS:-dp2,tp2} \
  HIDDEN=${HIDDEN:-4096,7168} QUANTS=${QUANTS:-fp8,nvfp4} TOKENS=${TOKENS:-1,16,128,256,512,1024} \
  BENCHES=quant bash results/shared_1xH100/81_quant_floor/run6.sh
