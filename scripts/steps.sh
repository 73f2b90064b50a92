# Sourced by the device scripts that run many steps in one call (time_experiments.sh,
# shared_gpu_timing.sh): each step logs to $DIR/NAME.log, a failure is remembered in $status and
# the call goes on, so one broken step does not cost the rest of the device time.
status=0

step() {  # step NAME CMD...
  local name=$1; shift
  local t0=$SECONDS rc=0
  "$@" > "$DIR/$name.log" 2>&1 || rc=$?
  [ $rc -eq 0 ] || status=1
  echo "=== $name: exit $rc after $((SECONDS - t0)) s"
}

# Patches of the checkout, one at a time. `applied` is the one in place: an EXIT trap that calls
# revert_patch puts the checkout back whatever happens.
applied=""

apply_patch() {  # apply_patch PATCH: false (and a failure remembered) when it does not apply
  if git apply "$1"; then applied=$1; return 0; fi
  echo "=== $1 does not apply to this checkout"
  status=1
  return 1
}

revert_patch() {  # the patch in place, if any, reverted
  [ -z "$applied" ] || { git apply -R "$applied" && applied=""; }
}
