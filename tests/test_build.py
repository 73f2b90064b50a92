"""CI compiles every CUDA source with the machine's nvcc (no GPU needed), so a kernel that
does not compile fails fast, and checks that abi.py, Python's mirror of csrc/abi.h, agrees
with the header: every constant and enum value, and the launch struct's layout."""

import re
import shutil
import subprocess

import pytest

from hybridcomm import abi, build

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")

HEADER = build.CSRC / "abi.h"


@pytest.mark.timeout(600)
def test_every_cuda_source_compiles_for_sm90a(tmp_path):
    objects = build.compile_objects("90a", tmp_path)
    assert sorted(o.stem for o in objects) == sorted(s.stem for s in build.sources())
    assert all(o.stat().st_size > 0 for o in objects)


def header_names() -> set[str]:
    """Every named constant of abi.h: constexpr ints and enum members."""
    text = re.sub(r"//[^\n]*", "", HEADER.read_text())
    names = set(re.findall(r"constexpr\s+int\s+(k\w+)\s*=", text))
    for body in re.findall(r"enum\b[^{;]*\{([^}]*)\}", text):
        names |= set(re.findall(r"(k\w+)\s*=", body))
    return names


def run_probe(tmp_path, body: str) -> list[str]:
    probe = tmp_path / "probe.cu"
    probe.write_text(f'#include <cstddef>\n#include <cstdio>\n#include "{HEADER}"\nint main() {{\n{body}\n}}\n')
    exe = tmp_path / "probe"
    subprocess.run([build.nvcc_path(), "-std=c++17", str(probe), "-o", str(exe)], check=True)
    return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")


def test_abi_py_names_every_constant_of_the_header():
    names = header_names()
    assert len(names) > 30  # the parse found the header's constants
    assert names - set(abi.C_NAMES) == set(), "in abi.h, missing from abi.py C_NAMES"
    assert set(abi.C_NAMES) - names == set(), "in abi.py C_NAMES, not in abi.h"


@pytest.mark.timeout(300)
def test_every_constant_and_enum_value_matches_the_header(tmp_path):
    body = "\n".join(f'  printf("{n} %lld\\n", (long long)hc::{n});' for n in sorted(abi.C_NAMES))
    got = dict(line.split() for line in run_probe(tmp_path, body) if line)
    assert {n: int(v) for n, v in got.items()} == {n: int(v) for n, v in abi.C_NAMES.items()}


@pytest.mark.timeout(300)
def test_group_args_layout_and_error_packing_match_the_header(tmp_path):
    fields = [name for name, _ in abi.GroupArgs._fields_]
    body = "\n".join([f'  printf("size %zu\\n", sizeof(hc::GroupArgs));']
                     + [f'  printf("{f} %zu\\n", offsetof(hc::GroupArgs, {f}));' for f in fields]
                     + ['  printf("packed %llu\\n", hc::pack_error(hc::kArgumentMismatch, hc::kScatterTokens, 3, 7,'
                        ' hc::kFieldCounts));'])
    got = dict(line.split() for line in run_probe(tmp_path, body) if line)
    expected = {"size": abi.ctypes.sizeof(abi.GroupArgs), **{f: getattr(abi.GroupArgs, f).offset for f in fields}}
    assert {k: int(v) for k, v in got.items() if k != "packed"} == expected
    assert abi.decode_error(int(got["packed"])) == abi.RecordedError(
        abi.ErrorCode.ARGUMENT_MISMATCH, abi.OpCode.SCATTER_TOKENS, 3, 7, abi.CallField.COUNTS)


@pytest.mark.timeout(300)
def test_fingerprints_name_the_first_field_that_differs(tmp_path):
    # One fingerprint, then one field changed at a time, most telling field first.
    base = "hc::make_fingerprint(hc::kGatherTokens, hc::kBFloat16, 1, 3, 0xbeef, 8192)"
    changed = {abi.CallField.OP: "hc::make_fingerprint(hc::kScatterTokens, hc::kBFloat16, 1, 3, 0xbeef, 8192)",
               abi.CallField.DTYPE: "hc::make_fingerprint(hc::kGatherTokens, hc::kFloat32, 1, 3, 0xbeef, 16384)",
               abi.CallField.ALGORITHM: "hc::make_fingerprint(hc::kGatherTokens, hc::kBFloat16, 0, 3, 0xbeef, 8192)",
               abi.CallField.VARIANT: "hc::make_fingerprint(hc::kGatherTokens, hc::kBFloat16, 1, 11, 0xbeef, 8192)",
               abi.CallField.COUNTS: "hc::make_fingerprint(hc::kGatherTokens, hc::kBFloat16, 1, 3, 0xbeee, 8192)",
               abi.CallField.WIDTH: "hc::make_fingerprint(hc::kGatherTokens, hc::kBFloat16, 1, 3, 0xbeef, 4096)"}
    body = "\n".join([f'  printf("same %d\\n", hc::first_difference({base}, {base}));']
                     + [f'  printf("{f.name} %d\\n", hc::first_difference({base}, {c}));' for f, c in changed.items()])
    got = dict(line.split() for line in run_probe(tmp_path, body) if line)
    assert {k: int(v) for k, v in got.items()} == {"same": 0, **{f.name: int(f) for f in changed}}


def test_launcher_signatures_in_abi_py_match_the_sources():
    """Every extern "C" launcher of csrc/*.cu has the argument types abi.SIGNATURES gives ctypes
    (a mismatch would pass garbage to a kernel, not fail)."""
    c_types = {"int": abi.ctypes.c_int, "int64_t": abi.ctypes.c_int64, "float": abi.ctypes.c_float,
               "GroupArgs*": abi.ctypes.POINTER(abi.GroupArgs), "LamportArgs*": abi.ctypes.POINTER(abi.LamportArgs),
               "cudaStream_t": abi.ctypes.c_void_p}
    found = {}
    for source in build.sources():
        text = re.sub(r"//[^\n]*", "", source.read_text())
        for name, params in re.findall(r'extern\s+"C"\s+int\s+(hc_\w+)\s*\(([^)]*)\)', text):
            types = []
            for param in params.split(",") if params.strip() else []:
                words = param.replace("*", " * ").split()[:-1]  # drop the parameter name
                words = [w for w in words if w != "const"]
                spelled = "".join(words) if words[0] in ("GroupArgs", "LamportArgs") else " ".join(words)
                types.append(c_types.get(spelled, abi.ctypes.c_void_p if "*" in words else None))
            found[name] = types
    assert set(found) == set(abi.SIGNATURES)
    for name, types in found.items():
        assert types == abi.SIGNATURES[name], name


@pytest.mark.timeout(300)
def test_lamport_args_layout_matches_the_header(tmp_path):
    fields = [name for name, _ in abi.LamportArgs._fields_]
    body = "\n".join([f'  printf("size %zu\\n", sizeof(hc::LamportArgs));']
                     + [f'  printf("{f} %zu\\n", offsetof(hc::LamportArgs, {f}));' for f in fields])
    got = dict(line.split() for line in run_probe(tmp_path, body) if line)
    expected = {"size": abi.ctypes.sizeof(abi.LamportArgs), **{f: getattr(abi.LamportArgs, f).offset for f in fields}}
    assert {k: int(v) for k, v in got.items()} == expected


@pytest.mark.timeout(600)
def test_the_trace_variant_compiles_and_its_rings_match_trace_py(tmp_path):
    # The trace hooks (csrc/trace.cuh) sit in the shared headers: compile the files that pass
    # through every hook (LL, bulk and Lamport waits, end_call) and the registry, link them, and
    # ask the library (no GPU needed) how many rings registered and how large one is.
    from hybridcomm import trace

    objects = []
    for name in ("all_reduce.cu", "lamport_all_reduce.cu", "trace.cu"):
        objects.append(tmp_path / (name + ".o"))
        cmd = [build.nvcc_path(), *build.NVCC_FLAGS, *build.VARIANTS["trace"], build.gencode("90a"), "-c",
               str(build.CSRC / name), "-o", str(objects[-1])]
        run = subprocess.run(cmd, capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr
    lib_path = tmp_path / "libtrace.so"
    subprocess.run([build.nvcc_path(), "-shared", build.gencode("90a"), *map(str, objects), "-o", str(lib_path)],
                   check=True)
    lib = abi.ctypes.CDLL(str(lib_path))
    assert lib.hc_trace_rings() == 2  # one per kernel file; the registry has none
    assert lib.hc_trace_ring_bytes() == trace.RING_HEADER + trace.RECORDS * trace.RECORD.itemsize


KERNELS = """
__global__ void scale(float* x, float s) { x[threadIdx.x] *= s; }
__global__ void shift(float* x, float s) { x[threadIdx.x] += %s; }
"""


@pytest.mark.timeout(300)
def test_sass_compare_tells_the_same_machine_code_from_other_code(tmp_path):
    """scripts/sass_compare.py (kernel refactors checked without a GPU): a kernel compiled from
    the same code is "same" even where the file around it changed; one that computes otherwise
    is not, with its instruction counts."""
    import sys

    sys.path.insert(0, str(build.CSRC.parents[2] / "scripts"))
    try:
        import sass_compare
    finally:
        sys.path.pop(0)

    def code(name: str, shift: str):
        source = tmp_path / f"{name}.cu"
        source.write_text(KERNELS % shift)
        return sass_compare.kernel_code(sass_compare.compile_cubin(source, tmp_path / f"{name}.cubin", "90a"))

    base = code("base", "s")
    assert len(base) == 2 and all(len(c) % sass_compare.INSTRUCTION_BYTES == 0 for c in base.values())
    rows = dict(sass_compare.compare(base, code("other", "s * s")))
    assert rows["_Z5scalePff"] == "same"
    assert rows["_Z5shiftPff"] != "same" and rows["_Z5shiftPff"].endswith(" instructions")
    assert dict(sass_compare.compare(base, {})) == {k: f"{len(c) // 16} -> - instructions" for k, c in base.items()}
    # --rename: an instance of a template that gained an argument pairs with the base's name
    grown = {"_Z4gridILi2ELi512ELi0ELb1EEvv": b"x", "_Z4gridILi2ELi256ELi0ELb1EEvv": b"y"}
    assert sass_compare.renamed(grown, r"Li512E(Li[0-9]ELb[01]E)", r"\1") == {
        "_Z4gridILi2ELi0ELb1EEvv": b"x", "_Z4gridILi2ELi256ELi0ELb1EEvv": b"y"}


# Under __launch_bounds__(1024, 2) a thread gets at most 32 registers, fewer than the 48 values
# `spills` keeps live across the loop: ptxas must put some in local memory.
RESOURCE_KERNELS = """
__global__ void small(float* x) { x[threadIdx.x] += 1.0f; }
__global__ void __launch_bounds__(1024, 2) spills(float* x, int n) {
  float v[48];
#pragma unroll
  for (int i = 0; i < 48; ++i) v[i] = x[threadIdx.x + i * 1024];
  for (int k = 0; k < n; ++k) {
#pragma unroll
    for (int i = 0; i < 48; ++i) v[i] = v[i] * v[(i + 1) % 48] + 1.0f;
  }
#pragma unroll
  for (int i = 0; i < 48; ++i) x[threadIdx.x + i * 1024] = v[i];
}
"""


@pytest.mark.timeout(300)
def test_kernel_resources_reports_registers_and_spills(tmp_path):
    """scripts/kernel_resources.py reads ptxas's per-kernel registers and spills: a kernel that
    fits spills nothing, one held to 32 registers with 48 live values spills."""
    import sys

    sys.path.insert(0, str(build.CSRC.parents[2] / "scripts"))
    try:
        import kernel_resources
    finally:
        sys.path.pop(0)

    source = tmp_path / "resources.cu"
    source.write_text(RESOURCE_KERNELS)
    found = {k.kernel: k for k in kernel_resources.parse_ptxas(kernel_resources.ptxas_report(source, "90a", tmp_path))}
    assert set(found) == {"_Z5smallPf", "_Z6spillsPfi"}
    small, spills = found["_Z5smallPf"], found["_Z6spillsPfi"]
    assert 0 < small.registers <= 32 and small.spill_stores == small.spill_loads == 0
    assert spills.registers <= 32 and spills.spill_stores > 0 and spills.spill_loads > 0
    assert kernel_resources.demangle(["_Z5smallPf"])[0] in ("small", "_Z5smallPf")  # without c++filt: as is
