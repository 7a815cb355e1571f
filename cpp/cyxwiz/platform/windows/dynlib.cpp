#include "cyxwiz/platform/dynlib.h"

#include "cyxwiz/platform/windows/text.h"

namespace cyxwiz::platform {

void* openLibrary(const std::string& path, std::string* error) {
  HMODULE m = ::LoadLibraryExW(win::widen(path).c_str(), nullptr, LOAD_LIBRARY_SEARCH_DEFAULT_DIRS | LOAD_LIBRARY_SEARCH_DLL_LOAD_DIR);
  if (!m) *error = win::systemMessage(::GetLastError());
  return reinterpret_cast<void*>(m);
}

void* findSymbol(void* library, const char* name) {
  return reinterpret_cast<void*>(::GetProcAddress(static_cast<HMODULE>(library), name));
}

std::string modulePathOf(const void* address) {
  HMODULE m = nullptr;
  if (!::GetModuleHandleExW(GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS | GET_MODULE_HANDLE_EX_FLAG_UNCHANGED_REFCOUNT,
                            static_cast<LPCWSTR>(address), &m)) {
    return "";
  }
  wchar_t path[32768];
  DWORD n = ::GetModuleFileNameW(m, path, sizeof path / sizeof path[0]);
  return n == 0 ? std::string() : win::narrow(std::wstring(path, n));
}

std::string sharedLibraryFile(const std::string& stem) { return stem + ".dll"; }

}  // namespace cyxwiz::platform
