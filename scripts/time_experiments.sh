#!/usr/bin/env bash
# On a machine with 2 or more GPUs, in one call: time kernel experiments (experiments/*.patch, or
# the ones named) against main with `bench quant`, and run the GPU tests they touch with each
# applied. Order: main, then each patch (applied, built, timed, tested, reverted), then main
# again: two runs of one machine drift by a few percent, so a change counts only where it beats
# both main runs (hybridcomm.bench.compare). Everything under $OUT/experiments/:
#   main_1.json, main_2.json, NAME.json (bench quant), NAME_vs_main_1.md, NAME_vs_main_2.md
#   (scripts/compare_results.py), NAME_tests.log, build and bench logs.
#   bash scripts/time_experiments.sh [experiments/NAME.patch ...]
# WORLD (2), LAYOUTS (dp2,tp2), TOKENS (1,16,128,256,512) and TESTS narrow it; one patch a call
# if they do not fit the device's 10 minutes. NVLink multicast stays off: never remove the exports.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
DIR="${OUT:-results/experiments-run}/experiments"
mkdir -p "$DIR"
patches=("$@")
[ ${#patches[@]} -gt 0 ] || patches=(experiments/*.patch)
WORLD=${WORLD:-2}; LAYOUTS=${LAYOUTS:-dp2,tp2}; TOKENS=${TOKENS:-1,16,128,256,512}
TESTS=${TESTS:-tests/test_gpu_quant.py tests/test_gpu_lamport_quant.py tests/test_gpu_row_grids.py}
source "$(dirname "$0")/steps.sh"  # step, status, apply_patch, revert_patch

bench() {
  step "bench_$1" python3 -m hybridcomm bench quant --world "$WORLD" --layouts "$LAYOUTS" --quant fp8,nvfp4 \
    --hidden 4096,7168 --tokens "$TOKENS" --out "$DIR/$1.json"
}
compare() {  # compare BASE NAME
  python3 scripts/compare_results.py "$DIR/$1.json" "$DIR/$2.json" > "$DIR/${2}_vs_$1.md" || status=1
}

step build_main python3 -m hybridcomm build
bench main_1
trap revert_patch EXIT  # the checkout goes back to main whatever happens
for patch in "${patches[@]}"; do
  name=$(basename "$patch" .patch)
  apply_patch "$patch" || continue
  step "build_$name" python3 -m hybridcomm build
  bench "$name"
  # shellcheck disable=SC2086  (one word per test file)
  step "${name}_tests" python3 -m pytest -q -p no:cacheprovider -m gpu $TESTS
  revert_patch
done
bench main_2
for patch in "${patches[@]}"; do
  name=$(basename "$patch" .patch)
  [ -f "$DIR/$name.json" ] || continue
  compare main_1 "$name"; compare main_2 "$name"
  echo "=== $name against main (median ratio per impl, before then after):"
  grep -A12 "^| impl | pairs" "$DIR/${name}_vs_main_1.md" "$DIR/${name}_vs_main_2.md" | grep -E "hybridcomm|hc_quant"
done
exit $status
