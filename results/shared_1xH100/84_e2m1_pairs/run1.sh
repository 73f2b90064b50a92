#!/usr/bin/env bash
# Run 84, call 1, one H100 shared by 2 ranks: e2m1_pairs.patch (in the checkout: e2m1 codes two
# values at a time in packed bf16, csrc/quant.cuh) through the GPU tests of the quantized
# gathers (run 83's run1.sh: the exhaustive element-code test on all 2^32 fp32 inputs among them)
# and `check --quick`, then ncu --stalls of every nvfp4 case of scripts/ncu_profile.py, main
# (the patch undone) and the change. Both builds travel xz-compressed.
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
P=results/shared_1xH100/84_e2m1_pairs/e2m1_pairs.patch
RUN=${RUN:-1} bash results/shared_1xH100/83_narrow_teams/run1.sh
R=call_${RUN:-1}_ncu; mkdir -p $R
profile() {  # profile NAME
  timeout ${NCU_TIMEOUT:-150} python3 scripts/ncu_profile.py --share-gpus --world 2 --stalls --cases "${CASES:-nvfp4}" \
      --out $R/ncu_$1 > $R/ncu_$1.log 2>&1
  echo "=== $1"; grep -E "^  void|inst_executed|cycles_active|gpu__time_duration" $R/ncu_$1/ncu_rank0.txt
}
git apply -R $P && { profile main; git apply $P; }
profile e2m1_pairs
tar czf "$OUT/$R.tgz" $R
