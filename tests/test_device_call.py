"""scripts/device_call.sh, sourced by every device call's run script and the timing scripts: it
must keep NVLink multicast off (DEVICE.md), unpack the carried builds where the library looks
for them, and give each call its own records folder."""

import lzma
import os
import pathlib
import shutil
import subprocess

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "device_call.sh"

pytestmark = pytest.mark.skipif(shutil.which("xz") is None, reason="device_call.sh unpacks with xz")


def _source_and_print(tmp_path, commands, env=None):
    script = f'set -u; source "{SCRIPT}"; {commands}'
    environ = {k: v for k, v in os.environ.items() if k != "XDG_CACHE_HOME"}
    environ.update(env or {})
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=environ, capture_output=True, text=True)
    return done


def test_multicast_stays_off_and_the_cache_is_the_checkouts(tmp_path):
    done = _source_and_print(tmp_path, "echo $NCCL_NVLS_ENABLE $TORCH_SYMM_MEM_DISABLE_MULTICAST "
                                       "$NVSHMEM_DISABLE_NVLS $XDG_CACHE_HOME")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "1", "1", f"{tmp_path}/.hc_cache"]


def test_carried_builds_are_unpacked_into_the_cache(tmp_path):
    libs = tmp_path / ".hc_cache" / "libs"
    libs.mkdir(parents=True)
    payload = os.urandom(3000)
    (libs / "libhybridcomm-90a-0123456789abcdef.so.xz").write_bytes(lzma.compress(payload))
    done = _source_and_print(tmp_path, "new_call 7; ls -d $R")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "call_7"
    unpacked = tmp_path / ".hc_cache" / "hybridcomm" / "libhybridcomm-90a-0123456789abcdef.so"
    assert unpacked.read_bytes() == payload


def test_bring_back_needs_the_tools_out(tmp_path):
    done = _source_and_print(tmp_path, "new_call 2; bring_back", env={"OUT": ""})
    assert done.returncode != 0
    assert "the device tool sets OUT" in done.stderr
    out = tmp_path / "out"
    out.mkdir()
    done = _source_and_print(tmp_path, "new_call 2; echo hi > $R/log; bring_back", env={"OUT": str(out)})
    assert done.returncode == 0, done.stderr
    assert (out / "call_2.tgz").stat().st_size > 0
