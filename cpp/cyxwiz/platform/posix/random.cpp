#include "cyxwiz/platform/random.h"

#include <cerrno>
#include <cstring>

#if defined(__linux__) && !defined(CYXWIZ_PORTABLE_POSIX)
#include <sys/random.h>
#else
#include <unistd.h>
#if defined(__APPLE__)
#include <sys/random.h>  // getentropy
#endif
#endif

#include "cyxwiz/common/error.h"

namespace cyxwiz::platform {

void randomBytes(void* out, size_t n) {
  auto* p = static_cast<unsigned char*>(out);
  size_t got = 0;
  while (got < n) {
#if defined(__linux__) && !defined(CYXWIZ_PORTABLE_POSIX)
    ssize_t k = ::getrandom(p + got, n - got, 0);
#else
    const size_t chunk = n - got < 256 ? n - got : 256;  // getentropy's limit
    ssize_t k = ::getentropy(p + got, chunk) == 0 ? static_cast<ssize_t>(chunk) : -1;
#endif
    if (k < 0 && errno != EINTR) throw Error(makeString("no random bytes from the system: ", std::strerror(errno)));
    if (k > 0) got += static_cast<size_t>(k);
  }
}

}  // namespace cyxwiz::platform
