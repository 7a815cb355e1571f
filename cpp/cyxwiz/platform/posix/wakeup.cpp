#include "cyxwiz/platform/wakeup.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#if defined(__linux__) && !defined(CYXWIZ_PORTABLE_POSIX)
#include <sys/eventfd.h>
#define CYXWIZ_EVENTFD 1
#endif

#include <cstdint>

#include "cyxwiz/common/error.h"

namespace cyxwiz::platform {

namespace {

void setFlags(int fd) {
  ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

}  // namespace

Wakeup::Wakeup(const std::string& who) {
#if defined(CYXWIZ_EVENTFD)
  int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) throw NetworkError(makeString(who, "eventfd failed: ", errorText(errno), "; raise the open-file limit (ulimit -n)"));
  read_ = write_ = fd;
#else
  int fds[2];
  if (::pipe(fds) != 0) throw NetworkError(makeString(who, "pipe failed: ", errorText(errno), "; raise the open-file limit (ulimit -n)"));
  setFlags(fds[0]);
  setFlags(fds[1]);
  read_ = fds[0];
  write_ = fds[1];
#endif
}

Wakeup::~Wakeup() {
  if (write_ != read_) ::close(static_cast<int>(write_));
  ::close(static_cast<int>(read_));
}

void Wakeup::signal() {
  uint64_t one = 1;  // an eventfd takes 8 bytes; a pipe as many as it is given
  (void)!::write(static_cast<int>(write_), &one, sizeof one);
}

void Wakeup::drain() {
  uint64_t buf[8];
  while (::read(static_cast<int>(read_), buf, sizeof buf) > 0) {
  }
}

DescriptorReserve::DescriptorReserve() : spare_(::open("/dev/null", O_RDONLY)) {
  if (spare_ >= 0) ::fcntl(static_cast<int>(spare_), F_SETFD, FD_CLOEXEC);
}

DescriptorReserve::~DescriptorReserve() { release(); }

void DescriptorReserve::release() {
  if (spare_ >= 0) ::close(static_cast<int>(spare_));
  spare_ = -1;
}

bool DescriptorReserve::acceptAndClose(SocketHandle listener) {
  if (spare_ < 0) return false;
  ::close(static_cast<int>(spare_));
  int fd = ::accept(static_cast<int>(listener), nullptr, nullptr);
  if (fd >= 0) ::close(fd);
  spare_ = ::open("/dev/null", O_RDONLY);
  if (spare_ >= 0) ::fcntl(static_cast<int>(spare_), F_SETFD, FD_CLOEXEC);
  return fd >= 0 && spare_ >= 0;
}

size_t descriptorLimit() {
  rlimit lim{};
  return ::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY ? lim.rlim_cur : 4096;
}

}  // namespace cyxwiz::platform
