#include "cyxwiz/device/cuda.h"


#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <mutex>

#include "cyxwiz/common/error.h"
#include "cyxwiz/platform/dynlib.h"

namespace cyxwiz::device {

namespace {

const char* kRemedyCpu = "or train on the CPU (model.to(\"cpu\"), DISTRIBUTED_BACKEND=cpu)";

struct Loaded {
  cuda::Api* api = nullptr;
  std::string why;  // set when api is null
};

// The library sits beside _core (both install into site-packages/pycyxwiz).
std::string libraryPath() {
  const std::string file = platform::sharedLibraryFile("cyxwiz_cuda");
  const std::string self = platform::modulePathOf(reinterpret_cast<const void*>(&libraryPath));
  size_t slash = self.find_last_of("/\\");
  return (slash == std::string::npos ? std::string() : self.substr(0, slash + 1)) + file;
}

Loaded load() {
  Loaded out;
  // Another build of the library (the tests' host emulator, tests/gpu/emulator): same ABI, same checks.
  const char* override = std::getenv("CYXWIZ_CUDA_LIBRARY");
  const bool overridden = override && *override;
  if (!cudaBuilt() && !overridden) {
    out.why = "this pycyxwiz was built without CUDA (" + cudaBuildNote() +
              "). For GPU support install the CUDA toolkit (nvcc) and `pip install nvidia-cublas nvidia-nccl-cu13`, "
              "then rebuild: pip install --no-build-isolation --force-reinstall . ; " + kRemedyCpu;
    return out;
  }
  const std::string path = overridden ? std::string(override) : libraryPath();
  std::string loadError;
  void* handle = platform::openLibrary(path, &loadError);
  if (!handle) {
    out.why = makeString("the CUDA library ", path, " could not be loaded: ", loadError,
                         ". Its cuBLAS and NCCL come from the nvidia-cublas and nvidia-nccl-cu13 wheels: "
                         "pip install nvidia-cublas nvidia-nccl-cu13; ", kRemedyCpu);
    return out;
  }
  using Entry = cuda::Api* (*)(int, const char**);
  auto entry = reinterpret_cast<Entry>(platform::findSymbol(handle, "cyxwiz_cuda_api"));
  const char* err = nullptr;
  cuda::Api* api = entry ? entry(cuda::kApiVersion, &err) : nullptr;
  if (!api) {
    out.why = makeString("the CUDA library ", path, " is unusable: ",
                         entry ? (err ? err : "no reason given") : "it has no cyxwiz_cuda_api entry point",
                         "; reinstall pycyxwiz");
    return out;
  }
  out.api = api;  // the handle stays open for the life of the process
  return out;
}

const Loaded& loaded() {
  static std::once_flag once;
  static Loaded result;
  std::call_once(once, [] { result = load(); });
  return result;
}

}  // namespace

bool cudaBuilt() { return CYXWIZ_CUDA_BUILT; }

std::string cudaBuildNote() {
  return cudaBuilt() ? "built with CUDA" : CYXWIZ_CUDA_REASON;
}

cuda::Api* tryCudaApi(std::string* why) {
  const Loaded& l = loaded();
  if (!l.api && why) *why = l.why;
  return l.api;
}

int cudaDeviceCount(std::string* why) {
  cuda::Api* api = tryCudaApi(why);
  if (!api) return 0;
  int count = 0;
  cuda::Status s = api->deviceCount(&count);
  if (!s.empty()) {
    if (why) *why = "no usable GPU: " + s + ". Check the driver with nvidia-smi";
    return 0;
  }
  if (count == 0 && why) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    *why = makeString("no GPU is visible (CUDA_VISIBLE_DEVICES=", visible ? visible : "<unset>", ")");
  }
  return count;
}

cuda::Api& cudaApi() {
  std::string why;
  cuda::Api* api = tryCudaApi(&why);
  if (!api) throw Error("GPU requested, but " + why);
  return *api;
}

void requireDevice(const Device& device, const std::string& who) {
  if (device.type == DeviceType::CPU) return;
  std::string why;
  int count = cudaDeviceCount(&why);
  if (count == 0) {
    // The "built without CUDA" reason already ends with the remedy.
    if (why.find(kRemedyCpu) == std::string::npos) why += std::string("; ") + kRemedyCpu;
    throw Error(makeString(who, ": ", device.str(), " requested, but ", why));
  }
  if (device.index < 0 || device.index >= count) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    throw InvalidArgument(makeString(who, ": ", device.str(), " requested, but ", count, " GPU",
                                     count == 1 ? " is" : "s are", " visible (cuda:0..cuda:", count - 1,
                                     ", CUDA_VISIBLE_DEVICES=", visible ? visible : "<unset>", ")"));
  }
}

Device parseDevice(const std::string& text) {
  std::string s = text;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "cpu") return Device{};
  if (s == "cuda" || s == "gpu") return Device{DeviceType::CUDA, 0};
  if (s.rfind("cuda:", 0) == 0 && s.size() > 5 && s.size() < 9 &&
      std::all_of(s.begin() + 5, s.end(), [](unsigned char c) { return std::isdigit(c); })) {
    return Device{DeviceType::CUDA, std::atoi(s.c_str() + 5)};
  }
  throw InvalidArgument(makeString("unknown device '", text, "'; use \"cpu\", \"cuda\" or \"cuda:N\""));
}

void check(const cuda::Status& status) {
  if (!status.empty()) throw Error(status);
}

}  // namespace cyxwiz::device
