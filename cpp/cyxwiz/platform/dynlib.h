// Loading a shared library at run time (the CUDA library): dlopen / LoadLibraryW.
#pragma once

#include <string>

namespace cyxwiz::platform {

// The library's handle, or nullptr and *error saying why. The handle is never closed.
void* openLibrary(const std::string& path, std::string* error);
void* findSymbol(void* library, const char* name);
// The file of the module (shared library or program) holding `address`; "" when the system won't say.
std::string modulePathOf(const void* address);
// "lib<stem>.so", "lib<stem>.dylib" or "<stem>.dll".
std::string sharedLibraryFile(const std::string& stem);

}  // namespace cyxwiz::platform
