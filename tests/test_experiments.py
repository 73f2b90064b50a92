"""The kernel patches waiting in experiments/ (experiments/README.md) apply to this checkout, each
alone: the next session with GPUs times them as they are (scripts/time_experiments.sh skips a
patch that does not apply), so a change to the kernels that breaks one must make it again."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATCHES = sorted((ROOT / "experiments").glob("*.patch"))


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
@pytest.mark.parametrize("patch", PATCHES, ids=[p.name for p in PATCHES])
def test_the_experiment_applies_to_this_checkout(patch):
    done = subprocess.run(["git", "apply", "--check", str(patch)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"{patch.name} does not apply: {done.stderr.strip()}"
