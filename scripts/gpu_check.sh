#!/usr/bin/env bash
# On the 4-GPU machine, in one call: build, GPU tests, benchmarks; logs and results under $OUT.
#   bash scripts/gpu_check.sh [stage ...]     stages: info build test check ops transitions layer quant nodes
# (default: all but quant: quantized-gather tests and bench quant). nodes: every GPU as two
# simulated nodes (ranks_per_node = GPUs / 2).
# NVLink multicast stays off (docs/architecture.md, "The kernel protocols"): never remove these exports.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-results/gpu-run}
LOGS="$OUT/run"  # everything goes here; packed into $OUT/run.tgz at the end (one file travels back)
mkdir -p "$LOGS"
stages=${*:-info build test check ops transitions layer nodes}
GPUS=$(python3 -c 'import torch; print(torch.cuda.device_count())')
RPN=$((GPUS / 2))
status=0
run() {  # run NAME CMD...: log to $OUT/NAME.log, remember failures, keep going
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$LOGS/$name.log"
  echo "=== $name: exit $rc after $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || status=1
}
for stage in $stages; do
  case $stage in
    info) run info python3 -m hybridcomm info --layout dp2xtp2 ;;
    build) run build python3 -m hybridcomm build ;;
    test) run test timeout "${TEST_TIMEOUT:-1500}" python3 -m pytest -q -p no:cacheprovider -o faulthandler_timeout=300 tests/test_gpu.py tests/test_gpu_agreement.py ;;
    check) run check python3 -m hybridcomm check --world 4 --device cuda ;;
    ops) run ops python3 -m hybridcomm bench ops --world 4 --out "$LOGS/ops_4xH200.json" ;;
    transitions) run transitions python3 -m hybridcomm bench transitions --out "$LOGS/transitions_4xH200.json" ;;
    layer) run layer python3 -m hybridcomm bench layer --layout dp2xtp2 --layout dp4 --layout tp4 \
             --tokens 1,4,16,64,256 --imbalanced --out "$LOGS/layer_4xH200.json" ;;
    nodes)
      run nodes_test timeout 1800 python3 -m pytest -q -p no:cacheprovider -o faulthandler_timeout=300 \
        tests/test_multinode.py
      run nodes_check python3 -m hybridcomm check --world "$GPUS" --ranks-per-node "$RPN" --device cuda \
        --table hierarchical
      run nodes_bench python3 -m hybridcomm bench nodes --world "$GPUS" --ranks-per-node "$RPN" \
        --out "$LOGS/nodes_${GPUS}xH200.json"
      # The model for the same shape, the "network" being NCCL over NVLink (no hop cost)
      run nodes_model python3 -m hybridcomm model --nodes 2 --gpus-per-node "$RPN" --net-gbps 270 --hop-us 0 \
        --node-legs nccl --layouts "dp$GPUS" --tokens 1,4,16,64,256,1024 ;;
    quant) run quant_test timeout "${TEST_TIMEOUT:-1500}" python3 -m pytest -q -p no:cacheprovider \
             -o faulthandler_timeout=300 tests/test_gpu_quant.py
           run quant python3 -m hybridcomm bench quant --out "$LOGS/quant_4xH200.json" ;;
    *) echo "unknown stage $stage"; status=2 ;;
  esac
done
tar czf "$OUT/run.tgz" -C "$LOGS" .
exit $status
