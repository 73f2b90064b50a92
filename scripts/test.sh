#!/usr/bin/env bash
# The test suite: CPU tests with gloo processes, CUDA sources compiled when nvcc is present,
# GPU tests when 4 GPUs are present (skipped otherwise). Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "$0")/env.sh"
if need pytest || need pytest_timeout; then
    say "first run: installing pytest and pytest-timeout with pip ..."
    "$PY" -m pip install -q pytest pytest-timeout
fi
if need transformers; then
    say "first run: installing transformers (hybridcomm[hf] tests) with pip ..."
    "$PY" -m pip install -q "transformers>=5.17,<6"
fi
cd "$(dirname "$0")/.."
exec "$PY" -m pytest -q -p no:cacheprovider tests "$@"
