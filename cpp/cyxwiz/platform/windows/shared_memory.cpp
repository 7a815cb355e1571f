#include "cyxwiz/platform/shared_memory.h"

#include "cyxwiz/common/error.h"
#include "cyxwiz/platform/process.h"
#include "cyxwiz/platform/random.h"
#include "cyxwiz/platform/windows/text.h"

#include <sddl.h>

namespace cyxwiz::platform {

namespace {

// "D:P(A;;GA;;;<this user's SID>)": a protected DACL that grants this user alone; nothing inherited.
std::wstring onlyThisUser() {
  HANDLE token = nullptr;
  if (!::OpenProcessToken(::GetCurrentProcess(), TOKEN_QUERY, &token)) return L"";
  alignas(8) unsigned char buf[512];
  DWORD n = 0;
  std::wstring sddl;
  if (::GetTokenInformation(token, TokenUser, buf, sizeof buf, &n)) {
    wchar_t* sid = nullptr;
    if (::ConvertSidToStringSidW(reinterpret_cast<TOKEN_USER*>(buf)->User.Sid, &sid)) {
      sddl = std::wstring(L"D:P(A;;GA;;;") + sid + L")";
      ::LocalFree(sid);
    }
  }
  ::CloseHandle(token);
  return sddl;
}

}  // namespace

const char* sharedMemoryPlace() { return "a named file mapping"; }

SharedMemory SharedMemory::create(size_t bytes) {
  SharedMemory s;
  s.name_ = makeString("Local\\cyxwiz-", currentPid(), "-", randomHex(8));
  SECURITY_ATTRIBUTES sa{sizeof sa, nullptr, FALSE};
  PSECURITY_DESCRIPTOR sd = nullptr;
  const std::wstring sddl = onlyThisUser();
  if (sddl.empty() || !::ConvertStringSecurityDescriptorToSecurityDescriptorW(sddl.c_str(), SDDL_REVISION_1, &sd, nullptr)) {
    throw Error(makeString("shared memory: cannot build a security descriptor for this user: ",
                           win::systemMessage(::GetLastError())));
  }
  sa.lpSecurityDescriptor = sd;
  const unsigned long long size = bytes;
  // SEC_COMMIT charges the whole size to the commit limit now: "not enough memory" here, not later.
  HANDLE h = ::CreateFileMappingW(INVALID_HANDLE_VALUE, &sa, PAGE_READWRITE | SEC_COMMIT, static_cast<DWORD>(size >> 32),
                                  static_cast<DWORD>(size & 0xffffffffu), win::widen(s.name_).c_str());
  const DWORD err = ::GetLastError();
  ::LocalFree(sd);
  if (h == nullptr) {
    throw Error(makeString("shared memory: cannot create the file mapping ", s.name_, " of ", bytes, " bytes: ",
                           win::systemMessage(err)));
  }
  if (err == ERROR_ALREADY_EXISTS) {
    ::CloseHandle(h);
    throw Error(makeString("shared memory: the file mapping ", s.name_, " already exists"));
  }
  s.mapping_ = h;
  s.data_ = static_cast<uint8_t*>(::MapViewOfFile(h, FILE_MAP_ALL_ACCESS, 0, 0, bytes));
  if (s.data_ == nullptr) {
    const DWORD mapErr = ::GetLastError();
    s.release();
    throw Error(makeString("shared memory: cannot map ", bytes, " bytes: ", win::systemMessage(mapErr)));
  }
  s.size_ = bytes;
  return s;
}

SharedMemory SharedMemory::attach(const std::string& name, size_t bytes) {
  SharedMemory s;
  s.name_ = name;
  HANDLE h = ::OpenFileMappingW(FILE_MAP_ALL_ACCESS, FALSE, win::widen(name).c_str());
  if (h == nullptr) throw Error(makeString("cannot open the file mapping ", name, ": ", win::systemMessage(::GetLastError())));
  s.mapping_ = h;
  s.data_ = static_cast<uint8_t*>(::MapViewOfFile(h, FILE_MAP_ALL_ACCESS, 0, 0, bytes));
  if (s.data_ == nullptr) {
    const DWORD err = ::GetLastError();
    s.release();
    throw Error(makeString("cannot map ", bytes, " bytes of the file mapping ", name, ": ", win::systemMessage(err),
                           " (is it smaller than expected?)"));
  }
  s.size_ = bytes;
  return s;
}

void SharedMemory::unlink() {}  // the name goes with the last handle

void SharedMemory::release() {
  if (data_ != nullptr) ::UnmapViewOfFile(data_);
  if (mapping_ != nullptr) ::CloseHandle(mapping_);
  data_ = nullptr;
  mapping_ = nullptr;
  size_ = 0;
}

}  // namespace cyxwiz::platform
