#!/usr/bin/env bash
# Run 83, call 10, one H100 shared by 2 ranks (no MPS: ncu_profile.py --share-gpus): ncu's
# instruction counts and stall reasons of the nvfp4 Lamport gather at 256 tokens (run 81's
# "same bytes" case, hidden 4096, where a 512-thread team held 256 lanes), with main's kernels
# (narrow_teams.patch undone) and then with the narrow teams (the checkout as it is).
set -u
export XDG_CACHE_HOME=$PWD/.hc_cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
P=results/shared_1xH100/83_narrow_teams/narrow_teams.patch
R=call_${RUN:-10}; mkdir -p $R .hc_cache/hybridcomm
for lib in .hc_cache/libs/*.xz; do [ -e "$lib" ] && xz -dc "$lib" > .hc_cache/hybridcomm/"$(basename "$lib" .xz)"; done
profile() {  # profile NAME
  timeout 200 python3 scripts/ncu_profile.py --share-gpus --world 2 --stalls --cases "nvfp4 Lamport, same bytes" \
      --out $R/ncu_$1 > $R/ncu_$1.log 2>&1
  echo "=== $1"; grep -E "^  void|inst_executed|cycles_active|gpu__time_duration" $R/ncu_$1/ncu_rank0.txt
}
git apply -R $P && { profile main; git apply $P; }
profile narrow_teams
tar czf "$OUT/$R.tgz" $R
