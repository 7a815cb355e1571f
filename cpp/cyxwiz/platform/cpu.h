// The processor: a pause for spin loops, and per-CPU clones of hot kernels where the toolchain can
// pick one at load time (ELF ifuncs; PE/COFF has no such thing, so Windows gets the baseline build).
#pragma once

#if defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
#include <immintrin.h>
#endif

namespace cyxwiz::platform {

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace cyxwiz::platform

#if defined(__ELF__) && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CYXWIZ_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CYXWIZ_CPU_CLONES
#endif
