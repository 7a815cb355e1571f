// cx.build_info() and __version__.
#include <pybind11/pybind11.h>

#include "cyxwiz/tensor/blas.h"
#include "cyxwiz/tensor/blas16.h"
#include "cyxwiz/tensor/dnnl.h"

namespace py = pybind11;

void cudaBuildInfo(py::dict& info);

void init_info(py::module_& m) {
  m.attr("__version__") = CYXWIZ_VERSION;
  // Called once by pycyxwiz/__init__.py (not here: an exception during module init becomes ImportError,
  // and a bad CYXWIZ_NUM_THREADS deserves its ValueError).
  static std::string threadPolicy = "BLAS threads: not configured";
  m.def("_configure_threads", []() { threadPolicy = cyxwiz::blas::configureThreadsFromEnvironment(); });
  // oneMKL for autocast("bfloat16")'s products (tensor/blas16.h): its path from pycyxwiz/__init__.py;
  // the switch for tests and benchmarks that compare both paths.
  m.def("_set_blas16_library", &cyxwiz::blas16::setLibrary, py::arg("path"));
  m.def("_set_blas16_provider", [](const std::string& name) {
    cyxwiz::blas16::setProvider(cyxwiz::blas16::parseProvider(name));
  }, py::arg("name"), "'auto' (measure at first use), 'onemkl', 'onednn' or 'sgemm'.");
  // oneDNN for the convolutions (tensor/dnnl.h), likewise.
  m.def("_set_dnnl_library", &cyxwiz::dnnl::setLibrary, py::arg("path"));
  m.def("_set_dnnl_enabled", &cyxwiz::dnnl::setEnabled, py::arg("enabled"));
  m.def("build_info", []() {
    py::dict info;
    info["version"] = CYXWIZ_VERSION;
#if defined(__clang__)
    info["compiler"] = "clang " __clang_version__;
#elif defined(__GNUC__)
    info["compiler"] = "gcc " __VERSION__;
#else
    info["compiler"] = "unknown";
#endif
    // "native", or "portable-posix" (built with CYXWIZ_PORTABLE_POSIX=ON), or "windows".
    info["platform"] = CYXWIZ_PLATFORM_BUILD;
    info["blas"] = cyxwiz::blas::libraryInfo();
    info["blas_threads"] = cyxwiz::blas::numThreads();
    info["blas_threads_policy"] = threadPolicy;
    info["blas16"] = cyxwiz::blas16::info();
    info["conv"] = cyxwiz::dnnl::info();
    cudaBuildInfo(info);
    return info;
  }, "What this build contains: compiler, BLAS, CUDA/NCCL (present or not).");
}
