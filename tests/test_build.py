"""The built extension: what it exports and what it links.

A C++ runtime linked statically into _core (the GPU machine's g++ does that) once crashed in
iostreams as soon as numpy had been imported first, because its exported locale symbols mixed with
the process's libstdc++. _core must export its module entry point and nothing of the engine or of the
C++ runtime's streams and locales.
"""

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
