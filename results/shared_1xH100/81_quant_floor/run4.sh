#!/usr/bin/env bash
# Run 81, call 4, one H100 shared by 2 ranks: where the quantized Lamport gather's instructions go.
# ncu's full set with the source page (per SASS instruction: executions, stall samples) of the
# same-bytes cases (fp8 256 tokens beside bf16 128, nvfp4 256 beside bf16 72), all in one archive.
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
R=call_4; mkdir -p $R
timeout 200 python3 scripts/ncu_profile.py --share-gpus --world 2 --sass \
    --cases "same bytes" --out $R/10_ncu_sass \
    > $R/10_ncu_sass.log 2>&1
rm -f $R/10_ncu_sass/*.ncu-rep
tar czf "$OUT/call_4.tgz" $R
ls -la $R/10_ncu_sass; tail -n 3 $R/*.log; head -c 1500 $R/10_ncu_sass/sass_rank0.csv
