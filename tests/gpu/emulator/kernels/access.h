// TEST DOUBLE, NOT GPU SUPPORT. The ranges a kernel touches, for cxemu::enqueue's checks: exactly
// the bytes the CUDA kernel reads or writes, so a buffer freed while the launch is queued is caught.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/emu.h"

namespace cyxwiz::cuda::emulated {

template <class T>
cxemu::Access reads(const T* p, int64_t count) {
  return cxemu::Access{p, static_cast<size_t>(count) * sizeof(T), false};
}

template <class T>
cxemu::Access writes(T* p, int64_t count) {
  return cxemu::Access{p, static_cast<size_t>(count) * sizeof(T), true};
}

}  // namespace cyxwiz::cuda::emulated
