"""The Windows OpenBLAS in a MinGW-w64 cross build (tools/windows/README.md): fetch_openblas.sh unpacks
the win_amd64 wheel of the installed scipy-openblas32 version and installs our CMake config beside it;
tools/windows/blas_check builds with cmake/mingw-w64.cmake and find_package(OpenBLAS CONFIG), links
OpenBLAS::OpenBLAS and, run under Wine, matches scipy_cblas_sgemm against a naive loop.

The unpacked wheel is kept in <cache>/openblas (tests/windows/wintools.py: cache_root), so only the
first run downloads it (~7 MB from PyPI); without PyPI, and no copy there yet, these tests skip."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from wintools import REPO, TOOLS, cache_root, run, win_path
from harness import clean_env

TOOLCHAIN = REPO / "cmake" / "mingw-w64.cmake"
OBJDUMP = "x86_64-w64-mingw32-objdump"


def tool(name: str) -> str:
    """cmake/ninja of this Python environment (pip's), else PATH's; skips without one (ninja: None)."""
    here = Path(sys.executable).parent / name
    path = str(here) if here.exists() else shutil.which(name)
    if not path and name == "cmake":
        pytest.skip("cmake not found")
    return path


@pytest.fixture(scope="session")
def openblas_dir(win_procs) -> Path:
    """OpenBLAS_DIR of the unpacked win_amd64 wheel (fetch_openblas.sh's last line of output)."""
    dest = cache_root() / "openblas"
    r = run(win_procs, ["bash", TOOLS / "fetch_openblas.sh", dest], clean_env(PYTHON=sys.executable),
            timeout=300, check=False)
    if r.rc != 0 and ("pip download" in r.err or "is not installed" in r.err):
        pytest.skip(f"no win_amd64 scipy-openblas32: {r.err.strip().splitlines()[-1]}")
    assert r.rc == 0, f"fetch_openblas.sh exited {r.rc}\n{r.out}\n{r.err}"
    return Path(r.out.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def blas_check_build(win_procs, mingw_cxx, openblas_dir, tmp_path_factory) -> Path:
    build = tmp_path_factory.mktemp("blas_check")
    cmd = [tool("cmake"), "-S", TOOLS / "blas_check", "-B", build, f"-DCMAKE_TOOLCHAIN_FILE={TOOLCHAIN}",
           f"-DOpenBLAS_DIR={openblas_dir}", "-DCMAKE_BUILD_TYPE=Release"]
    ninja = tool("ninja")
    if ninja:
        cmd += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
    run(win_procs, cmd, clean_env(), timeout=120)
    run(win_procs, [tool("cmake"), "--build", build], clean_env(), timeout=120)
    return build


def test_wheel_unpacked_with_our_config(openblas_dir):
    root = openblas_dir.parents[2]
    wheel = root / "scipy_openblas32"
    for f in ["lib/libscipy_openblas.dll", "lib/libscipy_openblas.lib", "include/cblas.h",
              "include/openblas_config.h"]:
        assert (wheel / f).is_file(), f
    assert (openblas_dir / "OpenBLASConfig.cmake").read_text() == (TOOLS / "openblas-config.cmake").read_text()
    # The same OpenBLAS as the Linux build of this environment.
    version = importlib.metadata.version("scipy-openblas32")
    assert (root / ".scipy-openblas32-win_amd64").read_text().strip() == version
    assert f" OpenBLAS {version} " in (wheel / "include" / "openblas_config.h").read_text()


def test_blas_check_links_the_dll_and_only_windows_dlls(blas_check_build, openblas_dir):
    exe = blas_check_build / "blas_check.exe"
    assert exe.is_file()
    assert (blas_check_build / "libscipy_openblas.dll").is_file()  # copied beside it by the build
    objdump = shutil.which(OBJDUMP)
    if not objdump:
        pytest.skip(f"{OBJDUMP} not found")
    out = subprocess.run([objdump, "-p", str(exe)], capture_output=True, text=True, timeout=60, check=True).stdout
    dlls = {line.split(":", 1)[1].strip().lower() for line in out.splitlines() if "DLL Name:" in line}
    # The MinGW runtime is linked statically (cmake/mingw-w64.cmake): no libstdc++-6.dll,
    # libgcc_s_seh-1.dll or libwinpthread-1.dll to copy; the BLAS stays a DLL.
    assert dlls == {"libscipy_openblas.dll", "kernel32.dll", "msvcrt.dll"}, dlls


def test_blas_check_under_wine(blas_check_build, wine, win_procs):
    r = run(win_procs, [wine.exe, blas_check_build / "blas_check.exe"], wine.env, timeout=60,
            cwd=blas_check_build, check=False)
    assert r.rc == 0, f"rc={r.rc}\n{r.out}\n{r.err}"
    lines = r.out.splitlines()
    assert lines[-1].strip() == "blas_check: OK", r.out
    assert sum(line.rstrip().endswith(" ok") for line in lines) == 4, r.out
    assert r.err == "", r.err


def test_blas_check_through_ctest_with_the_dll_on_winepath(blas_check_build, openblas_dir, wine, win_procs,
                                                          tmp_path):
    """ctest runs the test through CMAKE_CROSSCOMPILING_EMULATOR (wine, from the toolchain file); here
    the .exe sits alone in a folder and finds the DLL through WINEPATH."""
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy2(blas_check_build / "blas_check.exe", alone)
    dll_dir = openblas_dir.parents[2] / "scipy_openblas32" / "lib"
    r = run(win_procs, [wine.exe, alone / "blas_check.exe"], wine.env_with(WINEPATH=win_path(dll_dir)),
            timeout=60, cwd=alone, check=False)
    assert r.rc == 0 and r.out.splitlines()[-1].strip() == "blas_check: OK", f"rc={r.rc}\n{r.out}\n{r.err}"
    ctest = tool("ctest")
    r = run(win_procs, [ctest, "--output-on-failure", "--timeout", "60"], wine.env, timeout=90,
            cwd=blas_check_build, check=False)
    assert r.rc == 0 and "100% tests passed" in r.out, f"rc={r.rc}\n{r.out}\n{r.err}"


def test_linux_build_refuses_the_windows_config(win_procs, openblas_dir, tmp_path):
    """A native (Linux) configure pointed at the Windows package fails at find_package, naming why."""
    if not shutil.which("g++") and not shutil.which("c++"):
        pytest.skip("no native C++ compiler")
    r = run(win_procs, [tool("cmake"), "-S", TOOLS / "blas_check", "-B", tmp_path / "native",
                        f"-DOpenBLAS_DIR={openblas_dir}"], clean_env(), timeout=120, check=False)
    assert r.rc != 0
    assert "(win_amd64)" in r.err and "not compatible" in r.err, r.err
