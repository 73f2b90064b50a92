"""Compare the kernels' machine code of CUDA sources between a git revision and the working tree.

For changes made where no GPU can run the tests (a refactor of a kernel's source): a kernel
whose machine code is byte for byte the base's runs exactly as the base did, so the base's GPU
tests and timings still hold for it. A kernel that differs needs more: a disassembler
(`cuobjdump -sass` on the two cubins) to see how, and in the end the GPU tests.

    python3 scripts/sass_compare.py [--base HEAD] [--arch 90a] [file.cu ...]

(default: every csrc/*.cu). Each file is compiled to a cubin twice, from the base's csrc (git
archive) and from the working tree, with the library's flags (hybridcomm.build). Per kernel it
prints "same" or the instruction counts of both sides (a Hopper instruction is 16 bytes, so the
count is the size of the kernel's .text section / 16). Exit status 1 when any kernel differs.
A change that adds a template argument renames every instance: `--rename REGEX REPLACEMENT`
maps the working tree's mangled names back to the base's (re.sub) before they are paired, e.g.
`--rename 'Li512E(Li[0-9]ELb[01]E)' '\1'` for a team width of 512 inserted before two last ones.
"""

from __future__ import annotations

import argparse
import re
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from hybridcomm import build  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CSRC_IN_REPO = build.CSRC.relative_to(REPO)
TEXT_PREFIX = ".text."  # a kernel's code: section .text.<mangled name>
INSTRUCTION_BYTES = 16  # sm_90


def elf_sections(image: bytes) -> dict[str, bytes]:
    """Section name -> contents of a 64-bit little-endian ELF file (a cubin)."""
    (shoff,) = struct.unpack_from("<Q", image, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", image, 0x3A)

    def header(i):  # (name offset, type, offset, size)
        f = struct.unpack_from("<IIQQQQ", image, shoff + i * entry_size)
        return f[0], f[1], f[4], f[5]

    names_at = header(names_index)[2]
    sections = {}
    for i in range(count):
        name_offset, kind, offset, size = header(i)
        end = image.index(b"\0", names_at + name_offset)
        name = image[names_at + name_offset: end].decode()
        sections[name] = b"" if kind == 8 else image[offset: offset + size]  # 8: SHT_NOBITS
    return sections


def kernel_code(cubin: Path) -> dict[str, bytes]:
    """Kernel (mangled name) -> its machine code."""
    return {name[len(TEXT_PREFIX):]: code for name, code in elf_sections(cubin.read_bytes()).items()
            if name.startswith(TEXT_PREFIX)}


def compile_cubin(source: Path, out: Path, arch: str) -> Path:
    build.compile_cubin(source, out, arch)
    return out


def renamed(kernels: dict[str, bytes], pattern: str, replacement: str) -> dict[str, bytes]:
    """The kernels under names re.sub(pattern, replacement, name): a template argument a change
    added, mapped away so that its instances pair with the base's (--rename)."""
    return {re.sub(pattern, replacement, name): code for name, code in kernels.items()}


def compare(before: dict[str, bytes], after: dict[str, bytes]) -> list[tuple[str, str]]:
    """(kernel, verdict) for every kernel of either side: "same", or both instruction counts."""
    def count(code):
        return "-" if code is None else str(len(code) // INSTRUCTION_BYTES)

    rows = []
    for kernel in sorted(set(before) | set(after)):
        b, a = before.get(kernel), after.get(kernel)
        rows.append((kernel, "same" if a == b else f"{count(b)} -> {count(a)} instructions"))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD", help="git revision to compare against")
    parser.add_argument("--arch", default="90a")
    parser.add_argument("--rename", nargs=2, metavar=("REGEX", "REPLACEMENT"),
                        help="map the working tree's kernel names to the base's before pairing")
    parser.add_argument("files", nargs="*", help="csrc sources (default: every .cu)")
    args = parser.parse_args()
    files = [Path(f).name for f in args.files] or [s.name for s in build.sources()]
    differing = 0
    with tempfile.TemporaryDirectory(prefix="hc_sass_") as tmp:
        base = Path(tmp) / "base"
        base.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", args.base, str(CSRC_IN_REPO)],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        for name in files:
            before = kernel_code(compile_cubin(base / CSRC_IN_REPO / name, Path(tmp) / f"base_{name}.cubin",
                                               args.arch))
            after = kernel_code(compile_cubin(build.CSRC / name, Path(tmp) / f"now_{name}.cubin", args.arch))
            if args.rename:
                after = renamed(after, *args.rename)
            rows = compare(before, after)
            differing += sum(verdict != "same" for _, verdict in rows)
            same = sum(verdict == "same" for _, verdict in rows)
            print(f"{name}: {same} of {len(rows)} kernels the same machine code as {args.base}")
            for kernel, verdict in rows:
                if verdict != "same":
                    print(f"  {kernel}: {verdict}")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
