# Sourced by the run script of one device call (results/*/runN.sh) and by the timing scripts:
# what every call on the GPU machine needs before its work.
#   source scripts/device_call.sh; new_call 3     ($R = call_3, created: the call's records)
# - the environment: the checkout's src on PYTHONPATH, NVLink multicast off (never remove those
#   exports: DEVICE.md), unbuffered output, the build cache in the checkout (.hc_cache) unless XDG_CACHE_HOME is set;
# - the carried builds: each .hc_cache/libs/*.xz unpacked into the cache, so nothing is compiled
#   there (carry xz-compressed builds: two plain ones and the tree exceed what may travel);
# - start_mps: a private CUDA MPS daemon for ranks that share one GPU, quit when the script exits
#   (bench/shared.py: why timings on a shared GPU need it); stop_mps quits it (for an own trap);
# - bring_back: $R tarred into the tool's $OUT, since the tool brings back only so many files.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/.hc_cache}

mkdir -p "$XDG_CACHE_HOME/hybridcomm"
for lib in .hc_cache/libs/*.xz; do
  [ -e "$lib" ] && xz -dc "$lib" > "$XDG_CACHE_HOME/hybridcomm/$(basename "$lib" .xz)"
done

stop_mps() { echo quit | nvidia-cuda-mps-control; }
start_mps() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/hc_mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/hc_mps_log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d || { echo "=== could not start the MPS daemon"; exit 2; }
  trap stop_mps EXIT
}

new_call() { R=call_$1; mkdir -p "$R"; }
bring_back() { tar czf "${OUT:?the device tool sets OUT}/$R.tgz" "$R"; }
