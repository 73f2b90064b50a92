# Sourced by scripts/main.sh and scripts/test.sh: make the repo's code and its few
# dependencies importable, installing only what is missing (the GPU machine has torch
# preinstalled and no network, so nothing is installed there).
export PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/src${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never multicast
PY=${PYTHON:-python3}
need() { ! "$PY" -c "import $1" 2>/dev/null; }
# The pinned CPU build: a bare "torch" would pull a multi-GB CUDA build.
if need torch; then "$PY" -m pip install -q torch==2.13.0 || exit 1; fi
