#!/usr/bin/env bash
# The main job: a Hugging Face Qwen3-MoE decoding through hybridcomm (DP attention x EP MoE),
# every DP group's logits checked against the unmodified single-device model, step times and
# tokens/s printed. Without GPUs: a small Qwen3-MoE (4 layers, 16 experts top-4, fp32) on 4
# gloo processes, layout DP2xTP2 (a development path: CPU times are no speed claim). With GPUs:
# Qwen3-30B-A3B shapes, bf16, CUDA graphs, NCCL, NCCL on symmetric windows and hybridcomm, on
# the GPUs there are (dp2 on 2 GPUs, dp2xtp2 on 4). Extra arguments go to `hybridcomm bench
# model` (see --help); the old reference-decoder layer benchmark stays as `hybridcomm bench layer`.
set -euo pipefail
source "$(dirname "$0")/env.sh"
if need transformers; then "$PY" -m pip install -q "transformers>=5.17,<6" || exit 1; fi
exec "$PY" -m hybridcomm bench model "$@"  # layout: dp2 on 2-3 GPUs, dp2xtp2 on 4 GPUs or the CPU
