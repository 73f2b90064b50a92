#!/usr/bin/env bash
# On the GPU machine, in one call: build, GPU tests, benchmarks, profiles; logs and results
# under $OUT. The benchmarks' world: 4 with 4 or more GPUs, else 2; the tests and the check run
# world 8 on 8 or more (TEST_WORLD). With one GPU the ranks share it (GPU_RANKS of them, default
# 2, at most 8; src/hybridcomm/shared_gpu.py): our kernels run, time-sliced, without NCCL, so
# only the stages that check correctness (test, check) mean anything there.
#   bash scripts/gpu_check.sh [stage ...]
#   stages: info build test check ops transitions layer layer_quant quant pdl model nodes ncu tune trace sweep
# (default: info build test check ops transitions layer; one GPU: info build test check).
# nodes: every GPU as two simulated nodes (ranks_per_node = GPUs / 2). NVLink multicast stays
# off (docs/architecture.md, "The kernel protocols"): never remove these exports.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-results/gpu-run}
LOGS="$OUT/run"  # everything goes here; packed into $OUT/run.tgz at the end (one file travels back)
mkdir -p "$LOGS"
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
GPU_NAME=$(python3 -c "import torch; print(torch.cuda.get_device_name(0).split()[-1])" 2>/dev/null || echo GPU)
SHARE=()  # with one GPU: the flag that lets ranks share it
if [ "$GPUS" -ge 4 ]; then WORLD=4; elif [ "$GPUS" -ge 2 ]; then WORLD=2; else
  WORLD=${GPU_RANKS:-2}; SHARE=(--share-gpus)
fi
TEST_WORLD=$WORLD; [ "$GPUS" -ge 8 ] && TEST_WORLD=8  # one of the worlds tests/conftest.py has layouts for
if [ ${#SHARE[@]} -eq 0 ]; then
  stages=${*:-info build test check ops transitions layer}; TAG="${WORLD}x$GPU_NAME"
else
  stages=${*:-info build test check}; TAG="${WORLD}ranks-on-1x$GPU_NAME"
fi
if [ "$WORLD" -eq 4 ]; then
  LAYOUTS=dp2xtp2,dp4,tp4; LAYER_LAYOUTS="--layout dp2xtp2 --layout dp4 --layout tp4"; MAIN=dp2xtp2
  MODEL_LAYOUTS=${MODEL_LAYOUTS:-dp2xtp2 dp4 tp4}; DSV3_LAYERS=${DSV3_LAYERS-}
else
  LAYOUTS=dp2,tp2; LAYER_LAYOUTS="--layout dp2 --layout tp2"; MAIN=dp2
  MODEL_LAYOUTS=${MODEL_LAYOUTS:-dp2 tp2}; DSV3_LAYERS=${DSV3_LAYERS-2}
fi
MODEL_TOKENS=${MODEL_TOKENS:-1,4,16,64,256,uneven}; MODEL_TIMEOUT=${MODEL_TIMEOUT:-240}
MODEL_CONFIGS=${MODEL_CONFIGS:-qwen3-30b-a3b deepseek-v3}  # (model stage: one run per config x layout)
echo "=== $GPUS GPUs: world $WORLD, layouts $LAYOUTS${SHARE[@]+ (ranks sharing the GPU)}"
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
    info) run info python3 -m hybridcomm info --layout "$MAIN" ;;
    build) run build python3 -m hybridcomm build ;;
    # Every test marked gpu (pytest -m gpu), in tests/ or in GPU_TESTS (files or test ids, space-
    # separated: to split them over calls of 10 minutes when ranks share a GPU).
    # shellcheck disable=SC2086  (one word per test)
    test) run test timeout "${TEST_TIMEOUT:-2400}" python3 -m pytest -q -p no:cacheprovider -o faulthandler_timeout=300 \
           -m gpu --gpu-ranks "$TEST_WORLD" ${GPU_TESTS:-tests} ;;
    check) run check python3 -m hybridcomm check --world "$TEST_WORLD" --device cuda ${SHARE[@]+"${SHARE[@]}"} ;;
    ops) run ops python3 -m hybridcomm bench ops --world "$WORLD" --out "$LOGS/ops_$TAG.json" ;;
    transitions) run transitions python3 -m hybridcomm bench transitions --world "$WORLD" --layouts "$LAYOUTS" \
                   --out "$LOGS/transitions_$TAG.json" ;;
    # shellcheck disable=SC2086  (one word per layout flag)
    layer) run layer python3 -m hybridcomm bench layer $LAYER_LAYOUTS \
             --tokens 1,4,16,64,256 --imbalanced --out "$LOGS/layer_$TAG.json" ;;
    # ~1-3 minutes: rank 0's kernels under Nsight Compute (scripts/ncu_profile.py says what the numbers mean)
    ncu) run ncu timeout "${NCU_TIMEOUT:-300}" python3 scripts/ncu_profile.py --world "$WORLD" --out "$LOGS/ncu_$TAG" ;;
    # ~1 minute after its build: per-rank, per-phase times from in-kernel timestamps (scripts/latency_trace.py)
    trace) run trace timeout "${TRACE_TIMEOUT:-600}" python3 scripts/latency_trace.py --world "$WORLD" --out "$LOGS" ;;
    nodes)
      run nodes_test timeout 1800 python3 -m pytest -q -p no:cacheprovider -o faulthandler_timeout=300 \
        tests/test_multinode.py
      run nodes_check python3 -m hybridcomm check --world "$GPUS" --ranks-per-node "$RPN" --device cuda \
        --table hierarchical
      run nodes_bench python3 -m hybridcomm bench nodes --world "$GPUS" --ranks-per-node "$RPN" \
        --out "$LOGS/nodes_$TAG.json"
      # The model for the same shape, the "network" being NCCL over NVLink (no hop cost)
      run nodes_model python3 -m hybridcomm model --nodes 2 --gpus-per-node "$RPN" --net-gbps 270 --hop-us 0 \
        --node-legs nccl --layouts "dp$GPUS" --tokens 1,4,16,64,256,1024 ;;
    # the pipelined two-shot all_reduce's (chunk, blocks) against the baselines (~2 minutes)
    sweep) run sweep python3 scripts/pipeline_sweep.py --world "$WORLD" --out "$LOGS/sweep_$TAG" ;;
    # fp8 experts fed by the fp8 gather (docs/quantization.md): bf16, fp8, nvfp4 gathers, NCCL vs ours
    # shellcheck disable=SC2086
    layer_quant) run layer_quant python3 -m hybridcomm bench layer $LAYER_LAYOUTS --tokens 1,16,128 \
                   --quant none,fp8,nvfp4 --steps 10 --out "$LOGS/layer_quant_$TAG.json" ;;
    quant) run quant python3 -m hybridcomm bench quant --world "$WORLD" --layouts "$LAYOUTS" --hidden 4096,7168 \
             --tokens 1,16,64,128,256,512,1024 --out "$LOGS/quant_$TAG.json" ;;
    # ~1 minute: producer (GEMM, elementwise, ours) -> our op with launch overlap off and on
    pdl) run pdl python3 -m hybridcomm bench pdl --world "$WORLD" --out "$LOGS/pdl_$TAG.json" ;;
    # The real-shaped models, NCCL, NCCL on symmetric windows and hybridcomm: one timed call per
    # config x layout (JSON + md each). DeepSeek-V3 shapes: DSV3_LAYERS layers (2 on 2 GPUs; on
    # 4, empty: as many as one GPU holds with the single-device reference, hf/memory.py).
    model)
      for lay in $MODEL_LAYOUTS; do
        for cfg in $MODEL_CONFIGS; do
          layers=(); [ "$cfg" = deepseek-v3 ] && [ -n "$DSV3_LAYERS" ] && layers=(--layers "$DSV3_LAYERS")
          run "model_${cfg}_$lay" timeout -k 10 "$MODEL_TIMEOUT" python3 -m hybridcomm bench model --config "$cfg" \
            "${layers[@]}" --layout "$lay" --tokens "$MODEL_TOKENS" --timeout "$((MODEL_TIMEOUT - 20))" \
            --out "$LOGS/model_${cfg}_${lay}_$TAG.json"
        done
      done ;;
    # A selection table from this machine's measurements (bench ops + transitions, their results
    # kept beside it as table_<tag>_{ops,transitions}.json), then every op routed by it.
    tune) run tune timeout "${TUNE_TIMEOUT:-600}" python3 -m hybridcomm tune --world "$WORLD" --out "$LOGS/table_$TAG.json"
          run tune_check python3 -m hybridcomm check --world "$WORLD" --device cuda --quick --table "$LOGS/table_$TAG.json" ;;
    *) echo "unknown stage $stage"; status=2 ;;
  esac
done
tar czf "$OUT/run.tgz" -C "$LOGS" .
exit $status
