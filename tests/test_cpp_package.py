"""The C++ library without Python: plain `cmake` configures the top-level CMakeLists (no pip, no
pybind11), `cmake --install` gives include/, lib/ and the CMake package `cyxwiz`, and a separate C++
project builds against it with `find_package(cyxwiz CONFIG REQUIRED)` and
`target_link_libraries(app PRIVATE cyxwiz::core)`, naming nothing else (the BLAS, threads and libdl
are the target's usage requirements). The program's LinearModule output is checked against numpy, and
examples/cpp (a C++ DDP training program) is built the same way and run on 2 ranks.

The BLAS is the scipy-openblas32 wheel's, found through its Python package only to hand cmake its
OpenBLAS_DIR, as a C++ user would. The core is built once per session (tests/cpp_build.py, about a
minute on 2 cores), shared with tests/test_cpp_ranks.py.
"""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest
from cpp_build import ROOT, build_program, install_package

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


@pytest.mark.timeout(900)
def test_plain_cmake_installs_a_package_a_cpp_program_builds_against(tmp_path, tmp_path_factory):
    prefix = install_package(tmp_path_factory)  # the session's build, shared with test_cpp_ranks.py
    assert (prefix / "lib" / "cmake" / "cyxwiz" / "cyxwizConfig.cmake").is_file()
    assert (prefix / "include" / "cyxwiz" / "nn" / "linear.h").is_file()
    assert not list(prefix.rglob("*.so")), "the plain build installs the static library only (no _core, no CUDA)"

    app = tmp_path / "app"
    app.mkdir()
    (app / "CMakeLists.txt").write_text(CONSUMER_CMAKE)
    (app / "main.cpp").write_text(CONSUMER_MAIN)
    exe = build_program(app, app / "build", prefix, "app")
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = np.array([float(v) for v in out.stdout.split()], dtype=np.float32).reshape(4, 2)

    w = (0.5 * np.arange(6, dtype=np.float32) - 1.0).reshape(2, 3)
    b = np.array([0.25, -2.0], dtype=np.float32)
    x = (0.1 * np.arange(12, dtype=np.float32)).reshape(4, 3)
    np.testing.assert_allclose(got, x @ w.T + b, rtol=1e-6, atol=1e-6)


STEP_LINE = re.compile(r"^step +(\d+) +loss ([\d.]+)$", re.M)


@pytest.mark.timeout(900)
def test_the_cpp_example_trains_on_two_ranks(ranks, tmp_path, tmp_path_factory):
    """examples/cpp as its README builds and runs it: 2 ranks, the all_reduce line on each, the loss
    printed on rank 0 only, and falling."""
    prefix = install_package(tmp_path_factory)
    exe = build_program(ROOT / "examples" / "cpp", tmp_path / "build-example", prefix, "ddp_example")
    results = ranks.wait([ranks.popen([exe], ranks.env(r, 2), rank=r) for r in range(2)], timeout=60)
    assert [r.rc for r in results] == [0, 0], ranks.report(results)
    for r in results:
        assert f"[rank {r.rank}/2] all_reduce: sum of 1..2 = 3" in r.out, ranks.report(results)
    steps = [(int(s), float(loss)) for s, loss in STEP_LINE.findall(results[0].out)]
    assert [s for s, _ in steps] == [1, 10, 20, 30, 40, 50], results[0].out
    assert steps[-1][1] < 0.6 * steps[0][1], f"the loss did not fall: {steps}"
    assert not STEP_LINE.search(results[1].out), "rank 1 printed the loss too"
