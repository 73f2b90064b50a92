#!/usr/bin/env bash
# On a machine with 2 or more GPUs, in one call: time kernel experiments (experiments/*.patch, or
# the ones named) against main with `bench quant` (BENCHES adds `ops` and `transitions`), and run
# the GPU tests they touch with each applied. Order: main, then each patch (applied, built,
# timed, tested, reverted), then main again: two runs of one machine drift by a few percent, so a
# change counts only where it beats both main runs (hybridcomm.bench.compare). Everything under
# $OUT/experiments/:
#   main_1.json, main_2.json, NAME.json (bench quant), NAME_vs_main_1.md, NAME_vs_main_2.md,
#   NAME_between_mains.md (scripts/compare_results.py: a verdict per case), NAME_tests.log,
#   build and bench logs; with BENCHES="quant ops transitions", also NAME_ops.json,
#   NAME_ops_vs_main_1_ops.md, ... (SIZES: the ops' sizes).
#   bash scripts/time_experiments.sh [experiments/NAME.patch ...]
# WORLD (2), LAYOUTS (dp2,tp2), TOKENS (1,16,128,256,512), QUANTS (fp8,nvfp4), COUNTS (bench quant
# --counts: host) and TESTS narrow it; one patch a call if they do not fit the device's 10 minutes.
# Builds made beforehand travel in the cache or xz-compressed in .hc_cache/libs (device_call.sh).
# NVLink multicast stays off (device_call.sh's exports).
set -u
source "$(dirname "$0")/device_call.sh"  # the environment, the carried builds
DIR="${OUT:-results/experiments-run}/experiments"
mkdir -p "$DIR"
patches=("$@")
[ ${#patches[@]} -gt 0 ] || patches=(experiments/*.patch)
WORLD=${WORLD:-2}; LAYOUTS=${LAYOUTS:-dp2,tp2}; TOKENS=${TOKENS:-1,16,128,256,512}; QUANTS=${QUANTS:-fp8,nvfp4}
COUNTS=${COUNTS:-host}
BENCHES=${BENCHES:-quant}; SIZES=${SIZES:-2K,8K,32K,128K,512K,2M,8M}
TESTS=${TESTS:-tests/test_gpu_quant.py tests/test_gpu_lamport_quant.py tests/test_gpu_row_grids.py}
source "$(dirname "$0")/steps.sh"  # step, status, apply_patch, revert_patch

bench() {  # bench NAME: every bench of $BENCHES on the kernels the checkout has now
  local b
  for b in $BENCHES; do
    case $b in
      quant) step "bench_$1" python3 -m hybridcomm bench quant --world "$WORLD" --layouts "$LAYOUTS" \
               --quant "$QUANTS" --hidden 4096,7168 --tokens "$TOKENS" --counts "$COUNTS" --out "$DIR/$1.json" ;;
      ops) step "bench_$1_ops" python3 -m hybridcomm bench ops --device cuda --world "$WORLD" --sizes "$SIZES" \
             --out "$DIR/$1_ops.json" ;;
      transitions) step "bench_$1_transitions" python3 -m hybridcomm bench transitions --world "$WORLD" \
                     --layouts "$LAYOUTS" --tokens "$TOKENS" --out "$DIR/$1_transitions.json" ;;
    esac
  done
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
  for b in $BENCHES; do
    suffix=$([ "$b" = quant ] || echo "_$b")  # bench quant keeps its old file names
    [ -f "$DIR/$name$suffix.json" ] || continue
    compare "main_1$suffix" "$name$suffix"; compare "main_2$suffix" "$name$suffix"
    echo "=== $name against main, $b (median ratio per impl, before then after):"
    for base in main_1 main_2; do
      grep -A12 "^| impl | pairs" "$DIR/${name}${suffix}_vs_$base$suffix.md" | grep -E "hybridcomm|hc_"
    done
    python3 scripts/compare_results.py "$DIR/main_1$suffix.json" "$DIR/$name$suffix.json" "$DIR/main_2$suffix.json" \
      > "$DIR/${name}${suffix}_between_mains.md" || status=1
    echo "=== $name between the main runs, $b (cases faster / slower beyond the drift, within it):"
    grep -A12 "^| impl | faster" "$DIR/${name}${suffix}_between_mains.md" | grep -E "hybridcomm|hc_"
  done
done
exit $status
