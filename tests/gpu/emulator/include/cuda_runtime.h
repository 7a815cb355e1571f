// TEST DOUBLE, NOT GPU SUPPORT. Stands in for NVIDIA's cuda_runtime.h in host compilation: the
// runtime API (cuda_runtime_api.h), dim3, and the CUDA function qualifiers as no-ops, so that
// headers written for nvcc compile with g++. Kernels themselves (<<<>>>) are not compiled here.
#pragma once

#include "cuda_runtime_api.h"

#ifndef __host__
#define __host__
#endif
#ifndef __device__
#define __device__
#endif
#ifndef __global__
#define __global__
#endif
#ifndef __forceinline__
#define __forceinline__ __inline__  // as nvcc's host pass: the caller adds no second `inline`
#endif

struct dim3 {
  unsigned int x, y, z;
#ifdef __cplusplus
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
#endif
};
