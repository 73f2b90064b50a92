#!/usr/bin/env bash
# Run 84, calls 8-9, one H100 shared by 2 ranks under MPS: e2m1_pairs.patch timed against main
# again (run2.sh: main, the change, main), DP2 with every token count, then TP2 up to 512 tokens
# (at 1024 `bench quant --share-gpus` did not finish on either build, call 3: README).
set -u
RUN=${RUN:-8}
RUN=${RUN}_dp2 LAYOUTS=dp2 bash results/shared_1xH100/84_e2m1_pairs/run2.sh
RUN=${RUN}_tp2 LAYOUTS=tp2 TOKENS=1,16,128,256,512 bash results/shared_1xH100/84_e2m1_pairs/run2.sh
