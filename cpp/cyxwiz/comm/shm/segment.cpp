#include "cyxwiz/comm/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "cyxwiz/common/error.h"

namespace cyxwiz::comm::shm {

namespace {

std::string errnoText(int err) { return std::strerror(err); }

uint8_t* mapShared(int fd, size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}

}  // namespace

std::string randomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  size_t got = 0;
  while (got < bytes) {
    ssize_t k = ::getrandom(raw.data() + got, bytes - got, 0);
    if (k < 0 && errno != EINTR) throw Error(makeString("shared memory: getrandom failed: ", errnoText(errno)));
    if (k > 0) got += static_cast<size_t>(k);
  }
  static const char* digits = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : raw) {
    hex.push_back(digits[c >> 4]);
    hex.push_back(digits[c & 15]);
  }
  return hex;
}

Segment Segment::create(size_t bytes) {
  Segment s;
  s.name_ = makeString("/cyxwiz-", ::getpid(), "-", randomHex(8));
  int fd = ::shm_open(s.name_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) throw Error(makeString("shared memory: cannot create /dev/shm", s.name_, ": ", errnoText(errno)));
  s.linked_ = true;
  int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
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

Segment Segment::attach(const std::string& name, size_t bytes) {
  Segment s;
  s.name_ = name;
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) throw Error(makeString("cannot open /dev/shm", name, ": ", errnoText(errno)));
  struct stat st {};
  int err = ::fstat(fd, &st) == 0 ? 0 : errno;
  if (err == 0 && static_cast<size_t>(st.st_size) != bytes) {
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

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    release();
    data_ = o.data_;
    size_ = o.size_;
    name_ = std::move(o.name_);
    linked_ = o.linked_;
    o.data_ = nullptr;
    o.size_ = 0;
    o.linked_ = false;
  }
  return *this;
}

Segment::~Segment() { release(); }

void Segment::unlink() {
  if (linked_) ::shm_unlink(name_.c_str());
  linked_ = false;
}

void Segment::release() {
  unlink();
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace cyxwiz::comm::shm
