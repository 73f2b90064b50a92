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
