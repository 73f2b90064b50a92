# Sourced by scripts/main.sh and scripts/test.sh: make the repo's code and its few
# dependencies importable, installing only what is missing (the GPU machine has torch
# preinstalled and no network, so nothing is installed there).
export PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/src${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never multicast
PY=${PYTHON:-python3}
need() { ! "$PY" -c "import $1" 2>/dev/null; }
say() { echo "[hybridcomm] $*" >&2; }
# The pinned CPU build: a bare "torch" would pull a multi-GB CUDA build. numpy comes with it:
# without numpy torch warns in every process it starts.
if need torch; then
    say "first run: installing torch==2.13.0 (CPU build) and numpy with pip; this takes a minute or two ..."
    "$PY" -m pip install -q torch==2.13.0 numpy || exit 1
    say "installed $("$PY" -c 'import torch, numpy; print("torch", torch.__version__, "numpy", numpy.__version__)')"
elif need numpy; then  # torch preinstalled (the GPU machine, offline): numpy only if it can be had
    say "installing numpy (torch warns in every process without it) ..."
    "$PY" -m pip install -q numpy || say "numpy not installed (offline?): torch will warn; results are unaffected"
fi
