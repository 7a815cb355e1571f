#include "cyxwiz/platform/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "cyxwiz/common/error.h"
#include "cyxwiz/platform/process.h"
#include "cyxwiz/platform/random.h"

namespace cyxwiz::platform {

namespace {

std::string errnoText(int err) { return std::strerror(err); }

uint8_t* mapShared(int fd, size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}

// posix_fallocate (POSIX) reserves the pages: ENOSPC now, not SIGBUS on first touch of a full
// /dev/shm. macOS lacks it; its shared memory is not a file system that fills up: ftruncate sizes it.
int reserve(int fd, size_t bytes) {
#if defined(__APPLE__)
  return ::ftruncate(fd, static_cast<off_t>(bytes)) == 0 ? 0 : errno;
#else
  return ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
#endif
}

int openFlags() {
#if defined(O_CLOEXEC)
  return O_RDWR | O_CLOEXEC;
#else
  return O_RDWR;
#endif
}

}  // namespace

const char* sharedMemoryPlace() { return "/dev/shm"; }

SharedMemory SharedMemory::create(size_t bytes) {
  SharedMemory s;
  // macOS allows 31 characters: "/cyxwiz-" + pid + "-" + 16 hex digits fits.
  s.name_ = makeString("/cyxwiz-", currentPid(), "-", randomHex(8));
  int fd = ::shm_open(s.name_.c_str(), openFlags() | O_CREAT | O_EXCL, 0600);
  if (fd < 0) throw Error(makeString("shared memory: cannot create /dev/shm", s.name_, ": ", errnoText(errno)));
  s.linked_ = true;
  int err = reserve(fd, bytes);
  if (err == 0) s.data_ = mapShared(fd, bytes);
  if (err == 0 && s.data_ == nullptr) err = errno;
  ::close(fd);
  if (err != 0) {
    s.release();
    throw Error(makeString("shared memory: cannot reserve ", bytes, " bytes in /dev/shm: ", errnoText(err),
                           " (is /dev/shm full or too small? a container's default is 64 MiB)"));
  }
  s.size_ = bytes;
  return s;
}

SharedMemory SharedMemory::attach(const std::string& name, size_t bytes) {
  SharedMemory s;
  s.name_ = name;
  int fd = ::shm_open(name.c_str(), openFlags(), 0);
  if (fd < 0) throw Error(makeString("cannot open /dev/shm", name, ": ", errnoText(errno)));
  struct stat st {};
  int err = ::fstat(fd, &st) == 0 ? 0 : errno;
  // macOS rounds a shared memory object up to whole pages.
  if (err == 0 && (static_cast<size_t>(st.st_size) < bytes || static_cast<size_t>(st.st_size) > bytes + 65536)) {
    ::close(fd);
    throw Error(makeString("/dev/shm", name, " holds ", st.st_size, " bytes, not the ", bytes, " expected"));
  }
  if (err == 0) s.data_ = mapShared(fd, bytes);
  if (err == 0 && s.data_ == nullptr) err = errno;
  ::close(fd);
  if (err != 0) throw Error(makeString("cannot map /dev/shm", name, ": ", errnoText(err)));
  s.size_ = bytes;
  return s;
}

void SharedMemory::unlink() {
  if (linked_) ::shm_unlink(name_.c_str());
  linked_ = false;
}

void SharedMemory::release() {
  unlink();
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace cyxwiz::platform
