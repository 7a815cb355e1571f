#include "cyxwiz/platform/files.h"

#include <fcntl.h>
#include <io.h>

#include <cerrno>
#include <cstring>

#include "cyxwiz/platform/windows/text.h"

namespace cyxwiz::platform {

namespace {

HANDLE handleOf(std::FILE* f) { return reinterpret_cast<HANDLE>(::_get_osfhandle(::_fileno(f))); }

bool lockAll(HANDLE h) {
  OVERLAPPED at{};
  return ::LockFileEx(h, LOCKFILE_EXCLUSIVE_LOCK | LOCKFILE_FAIL_IMMEDIATELY, 0, MAXDWORD, MAXDWORD, &at) != 0;
}

}  // namespace

std::FILE* openForWriting(const std::string& path) {
  std::FILE* f = ::_wfopen(win::widen(path).c_str(), L"wb");
  if (f) ::SetHandleInformation(handleOf(f), HANDLE_FLAG_INHERIT, 0);
  return f;
}

// A Windows lock is mandatory: only this handle may read or write the file until it is closed.
void lockWhileWriting(std::FILE* f) { lockAll(handleOf(f)); }

bool syncToDisk(std::FILE* f) {
  if (std::fflush(f) != 0) return false;
  if (::FlushFileBuffers(handleOf(f))) return true;
  errno = win::errnoFromWin32(::GetLastError());
  return false;
}

int replaceFile(const std::string& from, const std::string& to) {
  if (::MoveFileExW(win::widen(from).c_str(), win::widen(to).c_str(), MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH)) {
    return 0;
  }
  return win::errnoFromWin32(::GetLastError());
}

int syncDirectory(const std::string&) { return 0; }  // MOVEFILE_WRITE_THROUGH made the rename durable

void removeAbandonedFile(const std::string& path, const char* magic, size_t n) {
  const std::wstring wide = win::widen(path);
  HANDLE h = ::CreateFileW(wide.c_str(), GENERIC_READ | GENERIC_WRITE, FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE,
                           nullptr, OPEN_EXISTING, FILE_ATTRIBUTE_NORMAL | FILE_FLAG_OPEN_REPARSE_POINT, nullptr);
  if (h == INVALID_HANDLE_VALUE) return;
  char head[16];
  DWORD got = 0;
  BY_HANDLE_FILE_INFORMATION info{};
  const bool abandoned = n <= sizeof head && ::GetFileInformationByHandle(h, &info) &&
                         !(info.dwFileAttributes & (FILE_ATTRIBUTE_DIRECTORY | FILE_ATTRIBUTE_REPARSE_POINT)) && lockAll(h) &&
                         ::ReadFile(h, head, static_cast<DWORD>(n), &got, nullptr) && std::memcmp(head, magic, got) == 0;
  ::CloseHandle(h);
  if (abandoned) ::DeleteFileW(wide.c_str());
}

bool isDirectory(const std::string& path) {
  DWORD a = ::GetFileAttributesW(win::widen(path).c_str());
  return a != INVALID_FILE_ATTRIBUTES && (a & FILE_ATTRIBUTE_DIRECTORY);
}

}  // namespace cyxwiz::platform
