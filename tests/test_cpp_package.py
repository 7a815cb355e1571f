"""The C++ library without Python: plain `cmake` configures the top-level CMakeLists (no pip, no
pybind11), `cmake --install` gives include/, lib/ and the CMake package `cyxwiz`, and a separate C++
project builds against it with `find_package(cyxwiz CONFIG REQUIRED)` and
`target_link_libraries(app PRIVATE cyxwiz::core)`, naming nothing else (the BLAS, threads and libdl
are the target's usage requirements). The program's LinearModule output is checked against numpy.

The BLAS is the scipy-openblas32 wheel's, found here through its Python package only to hand cmake
its OpenBLAS_DIR, as a C++ user would. Builds the whole core once (about a minute on 2 cores).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

CONSUMER_CMAKE = """cmake_minimum_required(VERSION 3.18)
project(app LANGUAGES CXX)
find_package(cyxwiz CONFIG REQUIRED)
add_executable(app main.cpp)
target_link_libraries(app PRIVATE cyxwiz::core)
"""

# y = x W^T + b for a LinearModule(3, 2) with set weights: each output on its own line.
CONSUMER_MAIN = r"""#include <cstdio>
#include "cyxwiz/nn/linear.h"
int main() {
  cyxwiz::nn::LinearModule layer(3, 2);
  auto params = layer.parameters();
  float* w = params[0]->value.data<float>();
  float* b = params[1]->value.data<float>();
  for (int i = 0; i < 6; ++i) w[i] = 0.5f * i - 1.0f;
  b[0] = 0.25f;
  b[1] = -2.0f;
  cyxwiz::Tensor x = cyxwiz::Tensor::zeros({4, 3});
  for (int i = 0; i < 12; ++i) x.data<float>()[i] = 0.1f * i;
  cyxwiz::Tensor y = layer.forward(x);
  for (int64_t i = 0; i < y.numel(); ++i) std::printf("%.9g\n", y.data<float>()[i]);
  return 0;
}
"""


def run(cmd: list[str], cwd: Path, timeout: int) -> None:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


@pytest.mark.timeout(900)
def test_plain_cmake_installs_a_package_a_cpp_program_builds_against(tmp_path):
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not on PATH")
    openblas = pytest.importorskip("scipy_openblas32")
    openblas_dir = os.path.join(openblas.get_lib_dir(), "cmake", "openblas")
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    build, prefix, app = tmp_path / "build", tmp_path / "prefix", tmp_path / "app"
    run(["cmake", "-S", str(ROOT), "-B", str(build), *generator, "-DCMAKE_BUILD_TYPE=Release",
         f"-DOpenBLAS_DIR={openblas_dir}", f"-DCMAKE_INSTALL_PREFIX={prefix}"], tmp_path, 300)
    run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2)], tmp_path, 800)
    run(["cmake", "--install", str(build)], tmp_path, 120)
    assert (prefix / "lib" / "cmake" / "cyxwiz" / "cyxwizConfig.cmake").is_file()
    assert (prefix / "include" / "cyxwiz" / "nn" / "linear.h").is_file()
    assert not list(prefix.rglob("*.so")), "the plain build installs the static library only (no _core, no CUDA)"

    app.mkdir()
    (app / "CMakeLists.txt").write_text(CONSUMER_CMAKE)
    (app / "main.cpp").write_text(CONSUMER_MAIN)
    # Only the prefix: OpenBLAS comes from the hint the package recorded.
    run(["cmake", "-S", str(app), "-B", str(app / "build"), *generator, f"-DCMAKE_PREFIX_PATH={prefix}"], app, 300)
    run(["cmake", "--build", str(app / "build")], app, 300)
    out = subprocess.run([str(app / "build" / "app")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = np.array([float(v) for v in out.stdout.split()], dtype=np.float32).reshape(4, 2)

    w = (0.5 * np.arange(6, dtype=np.float32) - 1.0).reshape(2, 3)
    b = np.array([0.25, -2.0], dtype=np.float32)
    x = (0.1 * np.arange(12, dtype=np.float32)).reshape(4, 3)
    np.testing.assert_allclose(got, x @ w.T + b, rtol=1e-6, atol=1e-6)
