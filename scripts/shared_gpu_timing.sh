#!/usr/bin/env bash
# On a machine with one GPU, in one call: time builds of our kernels against each other, the ranks
# sharing the GPU under CUDA MPS (bench/shared.py says what that can show and what it cannot: it is
# no speed claim, and no NVLink). Order: main, then each patch of src/hybridcomm/csrc (applied,
# built or found in the cache, timed, reverted), then main again; a change counts only where it
# differs from both main runs by more than they differ from each other.
#   bash scripts/shared_gpu_timing.sh [PATCH ...]     (no patch: main twice, to see the drift)
# Under $OUT/shared_timing/: NAME_BENCH.json / .md, NAME_vs_main_N_BENCH.md and
# NAME_between_mains_BENCH.md (scripts/compare_results.py: against each main run, and against both
# with a verdict per case) and a log per step. WORLD (2), BENCHES (ops transitions quant), SIZES,
# TOKENS, LAYOUTS, HIDDEN and QUANTS (the quantized gathers': 4096; fp8,nvfp4) and COUNTS (bench
# quant --counts: host) narrow it.
# The device tool brings back only so many files: give OUT a folder of the checkout and tar it into
# the tool's $OUT. Build the patched libraries beforehand (`hybridcomm build --arch 90a`, XDG_CACHE_HOME
# set) and carry the cache (or xz-compressed in .hc_cache/libs: device_call.sh): on the device each
# build costs ~100 s of device time. NVLink multicast stays off (device_call.sh's exports).
set -u
source "$(dirname "$0")/device_call.sh"  # the environment, the carried builds; start_mps, stop_mps
DIR="${OUT:-results/shared-timing-run}/shared_timing"
mkdir -p "$DIR"
WORLD=${WORLD:-2}; BENCHES=${BENCHES:-ops transitions quant}
SIZES=${SIZES:-2K,32K,512K,4M}; TOKENS=${TOKENS:-1,16,128,512}; LAYOUTS=${LAYOUTS:-dp2,tp2}; HIDDEN=${HIDDEN:-4096}
QUANTS=${QUANTS:-fp8,nvfp4}; COUNTS=${COUNTS:-host}
source "$(dirname "$0")/steps.sh"  # step, status, apply_patch, revert_patch

bench() {  # bench NAME: every bench of $BENCHES on the kernels the checkout has now
  local b common=(--world "$WORLD" --share-gpus)
  for b in $BENCHES; do
    case $b in
      ops) step "$1_ops" python3 -m hybridcomm bench ops --device cuda "${common[@]}" --sizes "$SIZES" \
             --out "$DIR/$1_ops.json" ;;
      transitions) step "$1_transitions" python3 -m hybridcomm bench transitions "${common[@]}" \
             --layouts "$LAYOUTS" --tokens "$TOKENS" --out "$DIR/$1_transitions.json" ;;
      quant) step "$1_quant" python3 -m hybridcomm bench quant "${common[@]}" --layouts "$LAYOUTS" \
             --quant "$QUANTS" --hidden "$HIDDEN" --tokens "$TOKENS" --counts "$COUNTS" \
             --out "$DIR/$1_quant.json" ;;
    esac
  done
}

# The MPS daemon, private to this call; it quits at the end whatever happens.
start_mps
trap 'revert_patch; stop_mps' EXIT

step build_main python3 -m hybridcomm build
bench main_1
for patch in "$@"; do
  name=$(basename "$patch" .patch)
  apply_patch "$patch" || continue
  step "build_$name" python3 -m hybridcomm build
  bench "$name"
  revert_patch
done
bench main_2
for name in main_2 $(for p in "$@"; do basename "$p" .patch; done); do
  for b in $BENCHES; do
    for base in main_1 main_2; do
      [ "$name" != "$base" ] && [ -f "$DIR/${name}_$b.json" ] && [ -f "$DIR/${base}_$b.json" ] || continue
      python3 scripts/compare_results.py "$DIR/${base}_$b.json" "$DIR/${name}_$b.json" \
        > "$DIR/${name}_vs_${base}_$b.md" || status=1
      echo "=== $name against $base, $b (median ratio per impl):"
      grep -A20 "^| impl | pairs" "$DIR/${name}_vs_${base}_$b.md" | sed '/^$/q'
    done
    [ "$name" != main_2 ] && [ -f "$DIR/${name}_$b.json" ] || continue
    python3 scripts/compare_results.py "$DIR/main_1_$b.json" "$DIR/${name}_$b.json" "$DIR/main_2_$b.json" \
      > "$DIR/${name}_between_mains_$b.md" || status=1
    echo "=== $name between main_1 and main_2, $b (cases beyond the drift per impl):"
    grep -A20 "^| impl | faster" "$DIR/${name}_between_mains_$b.md" | sed '/^$/q'
  done
done
exit $status
