#!/usr/bin/env bash
# The main job: decode steps of the reference MoE decoder on a DP2xTP2 layout, per backend.
# With 4 GPUs: NCCL vs hybridcomm, CUDA graphs, bf16. Without: 4 gloo processes on the CPU,
# the reference backend (for development; CPU times are not a speed claim).
# Extra arguments go to `hybridcomm bench layer` (see --help).
set -euo pipefail
source "$(dirname "$0")/env.sh"
exec "$PY" -m hybridcomm bench layer --layout dp2xtp2 "$@"
