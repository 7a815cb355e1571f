// Aligned host memory: std::aligned_alloc where the C library has it; Windows' C runtime has
// _aligned_malloc instead, whose blocks must go back through _aligned_free.
#pragma once

#include <cstddef>
#include <cstdlib>

#if defined(_WIN32)
#include <malloc.h>
#endif

namespace cyxwiz::platform {

// `bytes` must be a multiple of `alignment`; nullptr when out of memory.
inline void* alignedAlloc(size_t alignment, size_t bytes) {
#if defined(_WIN32)
  return ::_aligned_malloc(bytes, alignment);
#else
  return std::aligned_alloc(alignment, bytes);
#endif
}

inline void alignedFree(void* p) {
#if defined(_WIN32)
  ::_aligned_free(p);
#else
  std::free(p);
#endif
}

}  // namespace cyxwiz::platform
