"""CI compiles every CUDA source with the machine's nvcc (no GPU needed), so a kernel that
does not compile fails fast, and checks that Python's mirror of the launch arguments has
the header's layout."""

import shutil
import subprocess

import pytest

from hybridcomm import build, workspace

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


@pytest.mark.timeout(600)
def test_every_cuda_source_compiles_for_sm90a(tmp_path):
    objects = build.compile_objects("90a", tmp_path)
    assert sorted(o.stem for o in objects) == sorted(s.stem for s in build.sources())
    assert all(o.stat().st_size > 0 for o in objects)


@pytest.mark.timeout(300)
def test_python_mirror_of_group_args_matches_the_header(tmp_path):
    probe = tmp_path / "layout.cu"
    probe.write_text(f'''
#include <cstddef>
#include <cstdio>
#include "{build.CSRC / "protocol.cuh"}"
int main() {{
  printf("%zu %zu %zu %zu %zu %d %d\\n", sizeof(hc::GroupArgs), offsetof(hc::GroupArgs, regions),
         offsetof(hc::GroupArgs, error_mirror), offsetof(hc::GroupArgs, timeout_ns),
         offsetof(hc::GroupArgs, max_blocks), hc::kFlagBytes, hc::kMaxBlocks);
}}
''')
    exe = tmp_path / "layout"
    subprocess.run([build.nvcc_path(), "-std=c++17", str(probe), "-o", str(exe)], check=True)
    got = [int(v) for v in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    g = build.GroupArgs
    assert got == [build.ctypes.sizeof(g), g.regions.offset, g.error_mirror.offset, g.timeout_ns.offset,
                   g.max_blocks.offset, workspace.FLAG_BYTES, workspace.MAX_BLOCKS]
