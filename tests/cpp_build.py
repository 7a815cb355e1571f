"""Building the C++ library with plain cmake, installing it as the CMake package `cyxwiz`, and building
C++ programs against that install, for the tests that need it (tests/test_cpp_package.py,
tests/test_cpp_ranks.py). The library is built once per pytest session, whichever test asks first.

The BLAS is the scipy-openblas32 wheel's, found through its Python package only to hand cmake its
OpenBLAS_DIR, as a C++ user would (docs/cpp.md). Without cmake, a C++ compiler or that wheel the
tests skip, saying which is missing.

CI compiles the library ahead, in the background while other tests run (`python tests/cpp_build.py
DIR`, with CYXWIZ_CPP_PACKAGE_BUILD=DIR for the tests), installs it and builds tests/cpp's rank_checks
against it: the tests then wait for that build's lock and configure, build and install in the same
folders as usual, which finds everything built.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The session's install, once tried: ("ok", prefix), ("skip", reason) or ("fail", message).
_installed: dict[str, tuple[str, object]] = {}


def require_toolchain() -> None:
    """Skips the test unless cmake and a C++ compiler are on PATH (CXX, when set, names the compiler)."""
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not on PATH")
    compilers = [os.environ["CXX"].split()[0]] if os.environ.get("CXX") else ["c++", "g++", "clang++"]
    if not any(shutil.which(c) for c in compilers):
        pytest.skip(f"no C++ compiler on PATH (looked for {', '.join(compilers)})")


def generator() -> list[str]:
    return ["-G", "Ninja"] if shutil.which("ninja") else []


def jobs() -> str:
    """Parallel compile jobs: the cores this process may run on (what nproc says), not the host's."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return str(cores or 1)


def openblas_dir() -> str:
    openblas = pytest.importorskip("scipy_openblas32", reason="scipy-openblas32 (the BLAS) is not installed")
    return os.path.join(openblas.get_lib_dir(), "cmake", "openblas")


def run(cmd: list[str], cwd: Path, timeout: float) -> None:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


def prepared_build(what: str) -> Path | None:
    """Where CI's ahead-of-time build keeps `what` ("package", "prefix" or "rank_checks"), or None
    without CYXWIZ_CPP_PACKAGE_BUILD."""
    given = os.environ.get("CYXWIZ_CPP_PACKAGE_BUILD")
    if not given:
        return None
    base = Path(given).resolve()
    return base if what == "package" else base.parent / f"{base.name}-{what}"


def configure_and_build(build: Path, prefix: Path, blas: str) -> None:
    run(["cmake", "-S", str(ROOT), "-B", str(build), *generator(), "-DCMAKE_BUILD_TYPE=Release",
         f"-DOpenBLAS_DIR={blas}", f"-DCMAKE_INSTALL_PREFIX={prefix}"], build.parent, 300)
    run(["cmake", "--build", str(build), "-j", jobs()], build.parent, 800)


class _BuildLock:
    """An exclusive lock on DIR/.lock (flock; POSIX only, as CI's ahead-of-time build is): the tests wait,
    at most `timeout` seconds, for the background build that holds it."""

    def __init__(self, build: Path, timeout: float) -> None:
        self.path, self.timeout = build / ".lock", timeout

    def __enter__(self) -> "_BuildLock":
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "a")  # noqa: SIM115 (held until __exit__)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self.file.close()
                    raise AssertionError(f"the C++ package build in {self.path.parent} still held its lock after "
                                         f"{self.timeout:.0f} s (CYXWIZ_CPP_PACKAGE_BUILD); see its log") from None
                time.sleep(0.5)

    def __exit__(self, *exc: object) -> None:
        self.file.close()  # closing releases the flock


def install_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Configures the top-level CMakeLists without Python, builds the core and installs it; returns the
    install prefix (include/, lib/libcyxwiz.a, lib/cmake/cyxwiz/). Once per session: later calls return
    the same prefix, or skip or fail as the first one did, without building again."""
    if "package" not in _installed:
        try:
            require_toolchain()
            blas = openblas_dir()
            prepared = prepared_build("package")
            if prepared:  # built ahead by CI (see above): the same steps, found done
                build, prefix = prepared, prepared_build("prefix")
                with _BuildLock(build, timeout=1200):
                    configure_and_build(build, prefix, blas)
            else:
                work = tmp_path_factory.mktemp("cyxwiz_cpp")
                build, prefix = work / "build", work / "prefix"
                configure_and_build(build, prefix, blas)
            run(["cmake", "--install", str(build)], build.parent, 120)
            _installed["package"] = ("ok", prefix)
        except pytest.skip.Exception as e:
            _installed["package"] = ("skip", e.msg)
            raise
        except (AssertionError, subprocess.TimeoutExpired) as e:
            _installed["package"] = ("fail", f"building the C++ package failed: {e}")
            raise
    state, value = _installed["package"]
    if state == "skip":
        pytest.skip(str(value))
    if state == "fail":
        pytest.fail(f"{value} (an earlier test tried)", pytrace=False)
    return Path(str(value))


def build_program(source_dir: Path, build_dir: Path, prefix: Path, target: str, timeout: float = 300) -> Path:
    """Configures and builds the CMake project in `source_dir` against the package installed at `prefix`
    (only CMAKE_PREFIX_PATH: OpenBLAS comes from the hint the package recorded); returns `target`'s
    executable."""
    run(["cmake", "-S", str(source_dir), "-B", str(build_dir), *generator(), "-DCMAKE_BUILD_TYPE=Release",
         f"-DCMAKE_PREFIX_PATH={prefix}"], build_dir.parent, timeout)
    run(["cmake", "--build", str(build_dir), "-j", jobs()], build_dir.parent, timeout)
    exe = next((p for p in (build_dir / target, build_dir / f"{target}.exe") if p.is_file()), None)
    assert exe is not None, f"no {target} executable in {build_dir}"
    return exe


if __name__ == "__main__":
    # python tests/cpp_build.py DIR: CI's build ahead of the tests (above), under DIR's lock: the package,
    # its install, and tests/cpp's rank_checks against it (tests/test_cpp_ranks.py).
    os.environ["CYXWIZ_CPP_PACKAGE_BUILD"] = sys.argv[1]
    build, prefix = prepared_build("package"), prepared_build("prefix")
    with _BuildLock(build, timeout=60):
        configure_and_build(build, prefix, openblas_dir())
        run(["cmake", "--install", str(build)], build.parent, 120)
        build_program(ROOT / "tests" / "cpp", prepared_build("rank_checks"), prefix, "rank_checks", timeout=800)
