#include "cyxwiz/platform/files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#ifndef O_CLOEXEC
#define O_CLOEXEC 0
#endif
#ifndef O_DIRECTORY
#define O_DIRECTORY 0
#endif

namespace cyxwiz::platform {

std::FILE* openForWriting(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) return nullptr;
  std::FILE* f = ::fdopen(fd, "wb");
  if (!f) {
    int err = errno;
    ::close(fd);
    errno = err;
  }
  return f;
}

void lockWhileWriting(std::FILE* f) { ::flock(::fileno(f), LOCK_EX | LOCK_NB); }

bool syncToDisk(std::FILE* f) {
  if (std::fflush(f) != 0) return false;
#if defined(F_FULLFSYNC)
  // macOS: fsync reaches the drive, not its cache; F_FULLFSYNC does (and may be refused: then fsync).
  if (::fcntl(::fileno(f), F_FULLFSYNC) == 0) return true;
#endif
  return ::fsync(::fileno(f)) == 0;
}

int replaceFile(const std::string& from, const std::string& to) {
  return std::rename(from.c_str(), to.c_str()) == 0 ? 0 : errno;
}

int syncDirectory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return 0;  // a directory we may write but not read: the rename stands, unconfirmed on disk
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  return rc == 0 ? 0 : err;
}

void removeAbandonedFile(const std::string& path, const char* magic, size_t n) {
  // Read-write: NFS grants an exclusive lock only on a descriptor open for writing.
  int fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return;
  struct stat info {};
  char head[16];
  ssize_t got = 0;
  if (n <= sizeof head && ::fstat(fd, &info) == 0 && S_ISREG(info.st_mode) && ::flock(fd, LOCK_EX | LOCK_NB) == 0 &&
      (got = ::pread(fd, head, n, 0)) >= 0 && std::memcmp(head, magic, size_t(got)) == 0) {
    ::unlink(path.c_str());
  }
  ::close(fd);
}

bool isDirectory(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

}  // namespace cyxwiz::platform
