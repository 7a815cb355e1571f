"""The built extension: what it exports and what it links.

A C++ runtime linked statically into _core (the GPU machine's g++ does that) once crashed in
iostreams as soon as numpy had been imported first, because its exported locale symbols mixed with
the process's libstdc++. _core must export its module entry point and nothing of the engine or of the
C++ runtime's streams and locales.
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

import pycyxwiz as cx
import pycyxwiz._core as core


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("nm") is None, reason="needs Linux and binutils' nm")
def test_extension_exports_only_its_entry_point_and_no_runtime_internals():
    out = subprocess.run(["nm", "-D", "--defined-only", "-C", core.__file__], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    names = [line.split(" ", 2)[2] for line in out.splitlines() if line.count(" ") >= 2]
    assert "PyInit__core" in names
    leaked = [n for n in names if "cyxwiz" in n or "basic_ostream" in n or "std::locale" in n
              or "codecvt" in n or "num_put" in n or n.startswith("pybind11::")]
    assert leaked == [], f"_core exports symbols that can interpose across extensions: {leaked[:5]}"


def test_import_after_numpy_in_a_fresh_process():
    code = "import numpy, pycyxwiz as cx; m = cx.LinearModule(3, 2); print(m.forward(numpy.ones((1, 3))).shape)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "(1, 2)"


def test_build_info_names_the_blas_and_the_gpu_parts():
    info = cx.build_info()
    assert "OpenBLAS" in info["blas"]
    if info["cuda"]:
        assert info["nccl"] is True and info["cuda_version"] and info["nccl_version"], info
        assert info["cuda_architectures"], info
    else:
        assert info["nccl"] is False and info["cuda_version"] is None, info
        assert info["cuda_note"].startswith("CPU-only build: "), info


def test_build_info_names_the_platform_layer_build():
    # "portable-posix" when built with -Ccmake.define.CYXWIZ_PORTABLE_POSIX=ON (CI runs the distributed
    # tests once so); CYXWIZ_EXPECT_PLATFORM makes a run prove which build it tested.
    info = cx.build_info()
    assert info["platform"] in ("native", "portable-posix", "windows"), info
    expected = os.environ.get("CYXWIZ_EXPECT_PLATFORM")
    if expected:
        assert info["platform"] == expected, info


def test_only_the_platform_layer_names_the_operating_system():
    # The operating system is the platform layer's business (cpp/cyxwiz/platform): anywhere else an
    # #if on _WIN32, __linux__ or __APPLE__ is a fast path or a workaround that other systems lack.
    root = pathlib.Path(__file__).resolve().parent.parent / "cpp"
    platform = root / "cyxwiz" / "platform"
    pattern = re.compile(r"\b(_WIN32|__linux__|__APPLE__)\b")
    sources = [p for p in root.rglob("*") if p.suffix in (".h", ".cpp", ".cu", ".cuh")]
    assert len(sources) > 100 and any(p.is_relative_to(platform) for p in sources)
    offenders = [f"{p.relative_to(root)}:{n}: {line.strip()}" for p in sources if not p.is_relative_to(platform)
                 for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == [], "\n".join(offenders)
