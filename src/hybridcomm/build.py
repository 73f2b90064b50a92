"""Build csrc/*.cu with nvcc into a shared library named by GPU arch and a hash of the sources.

The library's API is extern "C" (declared in abi.py, mirroring csrc/abi.h) (raw pointers, sizes, cudaStream_t), so it does not depend
on PyTorch's C++ ABI: any nvcc that supports the arch builds it, and CI compiles it with no
GPU present (`hybridcomm build --arch 90a`).

Where the library is looked for, in order: the package's `prebuilt/` folder (a wheel built
after `hybridcomm build --out src/hybridcomm/prebuilt` carries it), then the cache. Only when
neither has it is nvcc needed, so a machine without the CUDA toolkit runs the kernels built
elsewhere (README: "Kernels without nvcc").
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import abi

CSRC = Path(__file__).parent / "csrc"
PREBUILT = Path(__file__).parent / "prebuilt"  # libraries shipped inside the package
SOURCE_SUFFIXES = (".cu", ".cuh", ".h")  # the files a library is built from (and its key hashes)
NVCC_FLAGS = ["-std=c++17", "-O3", "-lineinfo", "-Xcompiler", "-fPIC"]
# Library variants: name -> extra nvcc flags, each built and cached on its own. "trace": the
# kernels stamp their phase boundaries (csrc/trace.cuh; scripts/latency_trace.py reads them).
VARIANTS = {"": [], "trace": ["-DHC_TRACE"]}
variant = ""  # what load() builds when not told: a profiling script may select "trace" first


def sources() -> list[Path]:
    return sorted(CSRC.glob("*.cu"))


def nvcc_path() -> str:
    for candidate in (shutil.which("nvcc"), os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")):
        if candidate and os.path.exists(candidate):
            return candidate
    raise RuntimeError("nvcc not found: install the CUDA toolkit or put nvcc on PATH")


def device_arch() -> str:
    """The current GPU's arch ('90a' on Hopper: the arch-specific target)."""
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")


def gencode(arch: str) -> str:
    return f"-gencode=arch=compute_{arch},code=sm_{arch}"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hybridcomm"


def _build_key(arch: str, flags: list[str]) -> str:
    """What a library is built from: GPU arch, the host's machine type (a wheel built on x86_64
    must not serve aarch64), flags and sources. Not the nvcc that built it, so that finding a
    built library needs no nvcc (delete the cache to rebuild with another)."""
    h = hashlib.sha256()
    for part in (arch, platform.machine(), " ".join(flags)):
        h.update(part.encode())
    for f in sorted(p for p in CSRC.iterdir() if p.suffix in SOURCE_SUFFIXES):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def library_name(arch: str, variant: str = "") -> str:
    """The file name of the library these sources make for `arch` and `variant`."""
    stem = f"libhybridcomm{'-' + variant if variant else ''}-{arch}"
    return f"{stem}-{_build_key(arch, NVCC_FLAGS + VARIANTS[variant])}.so"


def find(arch: str, variant: str = "") -> Path | None:
    """The built library for `arch` and `variant`, prebuilt or cached, or None."""
    name = library_name(arch, variant)
    return next((folder / name for folder in (PREBUILT, cache_dir()) if (folder / name).exists()), None)


def _nvcc_to_build(arch: str, variant: str) -> str:
    try:
        return nvcc_path()
    except RuntimeError:
        raise RuntimeError(
            f"no kernel library {library_name(arch, variant)} for sm_{arch} in {PREBUILT} or {cache_dir()}, "
            f"and no nvcc to build one: install the CUDA toolkit (nvcc on PATH or CUDA_HOME set), or build "
            f"it where nvcc is (`hybridcomm build --arch {arch} --out DIR`) and put the file in one of "
            f"those folders") from None


def compile_cubin(source: Path, out: Path, arch: str, extra_flags: tuple[str, ...] = ()) -> str:
    """One source compiled with the library's flags into a cubin at `out` (the kernels' machine
    code, for inspection without a GPU: scripts/sass_compare.py, scripts/kernel_resources.py);
    returns nvcc's output, raises with it on failure."""
    cmd = [nvcc_path(), *NVCC_FLAGS, *extra_flags, gencode(arch), "-cubin", str(source), "-o", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode:
        raise RuntimeError(f"nvcc failed on {source}:\n{run.stdout}{run.stderr}")
    return run.stdout + run.stderr


def compile_objects(arch: str, out_dir: Path, nvcc: str | None = None, verbose: bool = False,
                    variant: str = "") -> list[Path]:
    """Compile every .cu to an object in out_dir (in parallel); raises with nvcc's output on failure."""
    nvcc = nvcc or nvcc_path()
    flags = NVCC_FLAGS + VARIANTS[variant]
    out_dir.mkdir(parents=True, exist_ok=True)

    def one(src: Path) -> Path:
        obj = out_dir / (src.stem + ".o")
        cmd = [nvcc, *flags, gencode(arch), "-c", str(src), "-o", str(obj)]
        if verbose:
            print(" ".join(cmd), flush=True)
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode:
            raise RuntimeError(f"nvcc failed on {src.name}:\n{run.stdout}{run.stderr}")
        return obj

    with ThreadPoolExecutor(max_workers=max(1, min(len(sources()), os.cpu_count() or 1))) as pool:
        return list(pool.map(one, sources()))


def build(arch: str | None = None, verbose: bool = False, variant: str | None = None) -> Path:
    """Path of the shared library for `arch` (and `variant`, default: the module's), building
    it into the cache first if neither the package's prebuilt folder nor the cache has it."""
    arch, variant = arch or device_arch(), variant if variant is not None else globals()["variant"]
    found = find(arch, variant)
    if found:
        return found
    nvcc = _nvcc_to_build(arch, variant)
    target = cache_dir() / library_name(arch, variant)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # ranks starting together build once
        if target.exists():
            return target
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            objects = compile_objects(arch, Path(tmp), nvcc, verbose, variant)
            partial = Path(tmp) / target.name
            cmd = [nvcc, "-shared", gencode(arch), *map(str, objects), "-o", str(partial)]
            run = subprocess.run(cmd, capture_output=True, text=True)
            if run.returncode:
                raise RuntimeError(f"nvcc link failed:\n{run.stdout}{run.stderr}")
            os.replace(partial, target)
    return target


# -- the C API (its argument types live in abi.py) -------------------------------------------------
_loaded: dict[tuple[str, str], ctypes.CDLL] = {}


def load(arch: str | None = None, variant: str | None = None) -> ctypes.CDLL:
    key = (arch or device_arch(), variant if variant is not None else globals()["variant"])
    if key not in _loaded:
        lib = ctypes.CDLL(str(build(key[0], variant=key[1])))
        for name, argtypes in abi.SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, ctypes.c_int
        _loaded[key] = lib
    return _loaded[key]
