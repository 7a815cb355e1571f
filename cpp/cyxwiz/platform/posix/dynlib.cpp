#include "cyxwiz/platform/dynlib.h"

#include <dlfcn.h>

namespace cyxwiz::platform {

void* openLibrary(const std::string& path, std::string* error) {
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* err = ::dlerror();
    *error = err ? err : "unknown error";
  }
  return handle;
}

void* findSymbol(void* library, const char* name) { return ::dlsym(library, name); }

std::string modulePathOf(const void* address) {
  Dl_info info{};
  if (!::dladdr(const_cast<void*>(address), &info) || !info.dli_fname) return "";
  return info.dli_fname;
}

std::string sharedLibraryFile(const std::string& stem) {
#if defined(__APPLE__)
  return "lib" + stem + ".dylib";
#else
  return "lib" + stem + ".so";
#endif
}

}  // namespace cyxwiz::platform
