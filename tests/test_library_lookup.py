"""Where the kernel library comes from (build.py): the package's prebuilt folder, then the
cache, and nvcc only when neither has it; and that an installed package carries every file its
kernels are built from. No nvcc or GPU needed: the libraries here are stand-in files, since
the lookup goes by name."""

import fnmatch
import shutil
from pathlib import Path

import pytest

from hybridcomm import build, cli

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def folders(tmp_path, monkeypatch):
    """An empty prebuilt folder and cache, and no nvcc: a call to nvcc fails the test."""
    monkeypatch.setattr(build, "PREBUILT", tmp_path / "prebuilt")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))

    def no_nvcc():
        raise RuntimeError("nvcc not found: install the CUDA toolkit or put nvcc on PATH")

    monkeypatch.setattr(build, "nvcc_path", no_nvcc)
    return build.PREBUILT, build.cache_dir()


def stand_in(folder: Path, arch="90a", variant="") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / build.library_name(arch, variant)
    path.write_bytes(b"stand-in")
    return path


def test_a_prebuilt_library_is_used_without_nvcc(folders):
    prebuilt, cache = folders
    stand_in(cache)
    shipped = stand_in(prebuilt)
    assert build.build("90a", variant="") == shipped  # the package's own first, then the cache


def test_the_cache_serves_when_nothing_is_prebuilt(folders):
    _, cache = folders
    cached = stand_in(cache)
    assert build.build("90a", variant="") == cached
    assert build.find("100a") is None  # another arch is another library
    assert build.find("90a", "trace") is None  # and so is another variant


def test_with_no_library_and_no_nvcc_the_error_says_what_to_do(folders):
    prebuilt, cache = folders
    stand_in(prebuilt, arch="100a")  # a library for another arch does not serve
    with pytest.raises(RuntimeError) as e:
        build.build("90a", variant="")
    message = str(e.value)
    for part in (build.library_name("90a"), str(prebuilt), str(cache), "hybridcomm build --arch 90a --out"):
        assert part in message


def test_the_name_follows_the_sources_flags_and_machine_type(folders, tmp_path, monkeypatch):
    csrc = tmp_path / "csrc"
    shutil.copytree(build.CSRC, csrc)
    monkeypatch.setattr(build, "CSRC", csrc)
    before = build.library_name("90a")
    assert build.library_name("90a", "trace") != before
    other = "x86_64" if build.platform.machine() == "aarch64" else "aarch64"
    with monkeypatch.context() as m:
        m.setattr(build.platform, "machine", lambda: other)
        assert build.library_name("90a") != before  # a wheel built on one machine type does not serve another
    assert build.library_name("90a") == before
    with open(csrc / "abi.h", "a") as header:
        header.write("\n// changed\n")
    assert build.library_name("90a") != before


def test_build_out_copies_the_library_into_a_folder(tmp_path, monkeypatch, capsys):
    library = stand_in(tmp_path / "cache")
    monkeypatch.setattr(build, "build", lambda arch, verbose, variant: library)
    assert cli.main(["build", "--arch", "90a", "--out", str(tmp_path / "out")]) == 0
    copied = tmp_path / "out" / library.name
    assert copied.read_bytes() == b"stand-in"
    assert capsys.readouterr().out.strip() == str(copied)


def test_the_package_carries_every_file_its_kernels_are_built_from():
    """pip installs what package-data names: a header left out (abi.h once was) leaves an
    installed hybridcomm unable to build its kernels, and changes their build key."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["hybridcomm"]
    package = REPO / "src" / "hybridcomm"
    needed = [p.relative_to(package).as_posix() for p in build.CSRC.iterdir() if p.suffix in build.SOURCE_SUFFIXES]
    assert len(needed) > 20
    missing = [f for f in needed if not any(fnmatch.fnmatch(f, p) for p in patterns)]
    assert missing == []
    assert any(fnmatch.fnmatch("prebuilt/" + build.library_name("90a"), p) for p in patterns)
