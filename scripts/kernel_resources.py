"""Registers and local-memory spills of every kernel, as ptxas reports them, without a GPU.

A kernel of ours runs 512 threads a block, so ptxas may give it at most 128 registers a thread;
what does not fit is spilled to local memory (per-thread stack, through L1), which costs loads
and stores on the hot path. This compiles csrc files with the library's flags plus `-Xptxas -v`
and prints, per kernel: registers, spill stores / loads (bytes a thread), stack frame.

    python3 scripts/kernel_resources.py [--arch 90a] [--spilling] [file.cu ...]

(default: every csrc/*.cu; a path is compiled where it is, with the headers beside it, so a
worktree of another revision compares; --spilling: only kernels that spill). Names are demangled where
c++filt is installed. docs/quantization.md uses it ("How close to the wire").
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from hybridcomm import build  # noqa: E402

# ptxas -v: "Function properties for <name>" / "<n> bytes stack frame, <n> bytes spill stores,
# <n> bytes spill loads" / "Used <n> registers, ..."
PROPERTIES = re.compile(r"Function properties for (\S+)\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, "
                        r"(\d+) bytes spill loads\n[^\n]*Used (\d+) registers")


@dataclass(frozen=True)
class Resources:
    kernel: str  # mangled
    registers: int
    spill_stores: int
    spill_loads: int
    stack: int


def parse_ptxas(text: str) -> list[Resources]:
    return [Resources(name, int(regs), int(stores), int(loads), int(stack))
            for name, stack, stores, loads, regs in PROPERTIES.findall(text)]


def ptxas_report(source: Path, arch: str, out_dir: Path) -> str:
    return build.compile_cubin(source, out_dir / f"{source.stem}.cubin", arch, ("-Xptxas", "-v"))


def demangle(names: list[str]) -> list[str]:
    """Readable names (c++filt, argument lists dropped), or the mangled ones without it."""
    if not names or not shutil.which("c++filt"):
        return names
    run = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    readable = run.stdout.splitlines()
    if run.returncode or len(readable) != len(names):
        return names
    return [re.sub(r"\(.*\)$", "", name).replace("hc::", "").replace("__nv_bfloat16", "bf16") for name in readable]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="90a")
    parser.add_argument("--spilling", action="store_true", help="only kernels that spill")
    parser.add_argument("files", nargs="*", help="csrc sources (default: every .cu)")
    args = parser.parse_args()
    files = [Path(f) if Path(f).exists() else build.CSRC / Path(f).name for f in args.files] or list(build.sources())
    with tempfile.TemporaryDirectory(prefix="hc_ptxas_") as tmp:
        for source in files:
            kernels = parse_ptxas(ptxas_report(source, args.arch, Path(tmp)))
            spilling = [k for k in kernels if k.spill_stores or k.spill_loads]
            print(f"{source.name}: {len(kernels)} kernels, {len(spilling)} spill")
            shown = spilling if args.spilling else kernels
            for k, name in zip(shown, demangle([k.kernel for k in shown])):
                print(f"  {k.registers:3d} registers, spill {k.spill_stores:4d} / {k.spill_loads:4d} bytes, "
                      f"stack {k.stack:4d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
