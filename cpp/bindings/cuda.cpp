// cx.cuda: what GPUs this process can use. Every call is safe without a GPU, a driver or a CUDA build.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdlib>
#include <optional>

#include "cyxwiz/device/cuda.h"
#include "gil.h"

namespace py = pybind11;
namespace device = cyxwiz::device;

namespace {

cyxwiz::cuda::DeviceProperties properties(int index) {
  device::requireDevice(cyxwiz::Device{cyxwiz::DeviceType::CUDA, index}, "cx.cuda");
  cyxwiz::cuda::DeviceProperties p;
  CYX_CUDA(deviceProperties(index, &p));
  return p;
}

std::string versionString(int code, int majorDiv, int minorDiv, int minorMod) {
  return std::to_string(code / majorDiv) + "." + std::to_string(code / minorDiv % minorMod);
}

}  // namespace

void init_cuda(py::module_& m) {
  py::module_ c = m.def_submodule("cuda", "GPUs visible to this process (CUDA builds).");
  c.def("is_available", []() { return device::cudaDeviceCount() > 0; },
        "True when this build has CUDA and at least one GPU is usable (never raises).");
  c.def("device_count", []() { return device::cudaDeviceCount(); }, "Visible GPUs; 0 without a CUDA build or a driver.");
  c.def("unavailable_reason", []() -> std::optional<std::string> {
    std::string why;
    if (device::cudaDeviceCount(&why) > 0) return std::nullopt;
    return why;
  }, "Why is_available() is False (no CUDA build, no driver, no GPU), or None.");
  c.def("get_device_name", [](int i) { return properties(i).name; }, py::arg("device") = 0);
  c.def("get_device_capability", [](int i) {
    auto p = properties(i);
    return py::make_tuple(p.major, p.minor);
  }, py::arg("device") = 0);
  c.def("get_device_properties", [](int i) {
    auto p = properties(i);
    py::dict d;
    d["name"] = p.name;
    d["major"] = p.major;
    d["minor"] = p.minor;
    d["total_memory"] = p.totalMemory;
    d["multi_processor_count"] = p.multiProcessors;
    d["uuid"] = p.uuid;
    d["pci_bus_id"] = p.pciBusId;
    return d;
  }, py::arg("device") = 0);
  c.def("synchronize", [](int i) {
    device::requireDevice(cyxwiz::Device{cyxwiz::DeviceType::CUDA, i}, "cx.cuda.synchronize");
    cyxwiz::bindings::BlockingCall unlocked;
    CYX_CUDA(synchronize(i));
  }, py::arg("device") = 0, "Waits for every kernel pycyxwiz queued on the device (its compute stream).");
  static bool tf32 = false;
  c.def("set_tf32", [](bool enabled) {
    tf32 = enabled;
    if (auto* api = device::tryCudaApi()) api->setTF32(enabled);
  }, py::arg("enabled"), "TF32 tensor cores for linear layers (off by default: results comparable with the CPU).");
  c.def("is_tf32_enabled", []() { return tf32; });
}

// build_info's CUDA fields: what was built, read from the library without touching a GPU. A CPU-only
// build pointed at another build of the library (CYXWIZ_CUDA_LIBRARY) reports that library.
void cudaBuildInfo(py::dict& info) {
  const char* override = std::getenv("CYXWIZ_CUDA_LIBRARY");
  const bool overridden = override && *override;
  const bool present = device::cudaBuilt() || overridden;
  info["cuda"] = present;
  info["cuda_version"] = py::none();
  info["nccl"] = present;
  info["nccl_version"] = py::none();
  info["cublas_version"] = py::none();
  info["cudnn_version"] = py::none();
  info["cuda_architectures"] = py::none();
  if (!present) {
    info["cuda_note"] = "CPU-only build: " + device::cudaBuildNote();
    return;
  }
  std::string why;
  cyxwiz::cuda::Api* api = device::tryCudaApi(&why);
  if (!api) {
    info["cuda_note"] = why;
    return;
  }
  info["cuda_version"] = versionString(api->cudaRuntimeVersion(), 1000, 10, 100);
  const int nccl = api->ncclVersion();  // 23203 = 2.32.3
  info["nccl_version"] = std::to_string(nccl / 10000) + "." + std::to_string(nccl / 100 % 100) + "." + std::to_string(nccl % 100);
  info["cublas_version"] = api->cublasVersion();
  info["cudnn_version"] = api->cudnnVersion();  // 0: built without cuDNN (no GPU convolution)
  py::list archs;  // "80-real 90-real ..." as CMake was given it
  for (py::handle a : py::str(api->architectures()).attr("split")()) archs.append(a);
  info["cuda_architectures"] = archs;
  info["cuda_note"] = overridden ? std::string("CUDA library from CYXWIZ_CUDA_LIBRARY=") + override : "CUDA build";
}
