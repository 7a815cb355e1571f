#include "cyxwiz/platform/random.h"

#include "cyxwiz/common/error.h"
#include "cyxwiz/platform/windows/text.h"

#include <bcrypt.h>

namespace cyxwiz::platform {

void randomBytes(void* out, size_t n) {
  auto* p = static_cast<unsigned char*>(out);
  while (n > 0) {
    const ULONG chunk = n > 0x10000000 ? 0x10000000 : static_cast<ULONG>(n);
    NTSTATUS st = ::BCryptGenRandom(nullptr, p, chunk, BCRYPT_USE_SYSTEM_PREFERRED_RNG);
    if (st != 0) throw Error(makeString("no random bytes from the system: BCryptGenRandom failed (status ", st, ")"));
    p += chunk;
    n -= chunk;
  }
}

}  // namespace cyxwiz::platform
