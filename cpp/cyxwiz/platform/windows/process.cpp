#include "cyxwiz/platform/process.h"

#include "cyxwiz/common/error.h"
#include "cyxwiz/platform/windows/text.h"

namespace cyxwiz::platform {

long currentPid() { return static_cast<long>(::GetCurrentProcessId()); }

std::string hostName() {
  wchar_t name[MAX_COMPUTERNAME_LENGTH + 1];
  DWORD n = MAX_COMPUTERNAME_LENGTH + 1;
  return ::GetComputerNameW(name, &n) ? win::narrow(std::wstring(name, n)) : std::string("?");
}

bool processGone(long pid) {
  if (pid <= 0) return false;
  HANDLE h = ::OpenProcess(SYNCHRONIZE | PROCESS_QUERY_LIMITED_INFORMATION, FALSE, static_cast<DWORD>(pid));
  if (h == nullptr) return ::GetLastError() == ERROR_INVALID_PARAMETER;  // no such process; else not ours to see
  const bool exited = ::WaitForSingleObject(h, 0) == WAIT_OBJECT_0;
  ::CloseHandle(h);
  return exited;
}

// Named file mappings in Local\ are per session: the computer, the session and the user decide.
std::string hostIdentity() {
  DWORD session = 0;
  ::ProcessIdToSessionId(::GetCurrentProcessId(), &session);
  wchar_t user[257];
  DWORD n = 257;
  std::string who = ::GetUserNameW(user, &n) && n > 0 ? win::narrow(std::wstring(user, n - 1)) : std::string("?");
  return makeString("host ", hostName(), " session ", session, " user ", who);
}

std::string pidNamespace() { return "global"; }

void atFork(void (*)(), void (*)(), void (*)()) {}

}  // namespace cyxwiz::platform
