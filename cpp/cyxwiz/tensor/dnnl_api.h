// The part of oneDNN 3.x's C API (dnnl.h) that the convolution kernels call, declared here because
// oneDNN is loaded at run time (the onednn-cpu-gomp wheel) and its headers are not a build
// requirement. Every handle is opaque in 3.x, so only function types and these enum values matter;
// tests/test_conv_kernels.py compiles a check of every value against the real dnnl.h when the
// onednn-devel wheel is installed.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cyxwiz::dnnl_api {

using Status = int;          // dnnl_status_t; 0 is dnnl_success
using Handle = void*;        // dnnl_engine_t, dnnl_stream_t, dnnl_memory_desc_t, dnnl_primitive_desc_t, ...
using ConstHandle = const void*;
using Dims = int64_t[12];    // dnnl_dims_t (DNNL_MAX_NDIMS = 12)
struct ExecArg {             // dnnl_exec_arg_t
  int arg;
  Handle memory;
};

constexpr Status kSuccess = 0;
constexpr int kEngineCpu = 1;          // dnnl_cpu
constexpr unsigned kStreamInOrder = 1;  // dnnl_stream_in_order
constexpr int kUndef = 0, kF32 = 3, kBF16 = 2;  // dnnl_data_type_t
constexpr int kTagAny = 1, kTagA = 2, kTagAB = 3, kTagABCD = 5, kTagABCDE = 6;  // dnnl_format_tag_t
constexpr int kForwardTraining = 64, kBackwardData = 160, kBackwardWeights = 192;  // dnnl_prop_kind_t
constexpr int kConvolutionDirect = 1;  // dnnl_alg_kind_t
constexpr int kQueryImplInfoStr = 8;   // dnnl_query_t
constexpr int kQuerySrcMd = 129, kQueryDiffSrcMd = 130, kQueryWeightsMd = 131, kQueryDiffWeightsMd = 132,
              kQueryDstMd = 133, kQueryDiffDstMd = 134;
constexpr int kArgSrc = 1, kArgDst = 17, kArgWeights = 33, kArgBias = 41, kArgDiffSrc = 129, kArgDiffDst = 145,
              kArgDiffWeights = 161, kArgDiffBias = 169;  // DNNL_ARG_*; a reorder's FROM/TO are SRC/DST

struct Functions {
  Status (*engineCreate)(Handle* engine, int kind, size_t index);
  Status (*streamCreate)(Handle* stream, Handle engine, unsigned flags);
  Status (*streamWait)(Handle stream);
  Status (*memoryDescCreateWithTag)(Handle* md, int ndims, const int64_t* dims, int dtype, int tag);
  Status (*memoryDescDestroy)(Handle md);
  int (*memoryDescEqual)(ConstHandle lhs, ConstHandle rhs);
  size_t (*memoryDescGetSize)(ConstHandle md);
  Status (*memoryCreate)(Handle* memory, ConstHandle md, Handle engine, void* data);
  Status (*memoryDestroy)(Handle memory);
  Status (*convForwardPdCreate)(Handle* pd, Handle engine, int prop, int alg, ConstHandle src, ConstHandle weights,
                                ConstHandle bias, ConstHandle dst, const int64_t* strides, const int64_t* dilates,
                                const int64_t* padL, const int64_t* padR, ConstHandle attr);
  Status (*convBackwardDataPdCreate)(Handle* pd, Handle engine, int alg, ConstHandle diffSrc, ConstHandle weights,
                                     ConstHandle diffDst, const int64_t* strides, const int64_t* dilates,
                                     const int64_t* padL, const int64_t* padR, ConstHandle hint, ConstHandle attr);
  Status (*convBackwardWeightsPdCreate)(Handle* pd, Handle engine, int alg, ConstHandle src, ConstHandle diffWeights,
                                        ConstHandle diffBias, ConstHandle diffDst, const int64_t* strides,
                                        const int64_t* dilates, const int64_t* padL, const int64_t* padR,
                                        ConstHandle hint, ConstHandle attr);
  Status (*reorderPdCreate)(Handle* pd, ConstHandle srcMd, Handle srcEngine, ConstHandle dstMd, Handle dstEngine,
                            ConstHandle attr);
  ConstHandle (*pdQueryMd)(ConstHandle pd, int what, int index);
  Status (*pdQuery)(ConstHandle pd, int what, int index, void* result);
  Status (*pdDestroy)(Handle pd);
  Status (*primitiveCreate)(Handle* primitive, ConstHandle pd);
  Status (*primitiveDestroy)(Handle primitive);
  Status (*primitiveExecute)(ConstHandle primitive, Handle stream, int nargs, const ExecArg* args);
  // bfloat16 matrix products (matmul with strided operands; beta = 1 as a sum post-op)
  Status (*memoryDescCreateWithStrides)(Handle* md, int ndims, const int64_t* dims, int dtype, const int64_t* strides);
  Status (*matmulPdCreate)(Handle* pd, Handle engine, ConstHandle src, ConstHandle weights, ConstHandle bias,
                           ConstHandle dst, ConstHandle attr);
  Status (*attrCreate)(Handle* attr);
  Status (*attrDestroy)(Handle attr);
  Status (*postOpsCreate)(Handle* postOps);
  Status (*postOpsDestroy)(Handle postOps);
  Status (*postOpsAppendSum)(Handle postOps, float scale, int32_t zeroPoint, int dtype);
  Status (*attrSetPostOps)(Handle attr, ConstHandle postOps);
  const void* (*version)();  // const dnnl_version_t*: {int major, minor, patch; const char* hash; unsigned cpu_runtime, gpu_runtime}
  void (*ompSetNumThreads)(int);  // libgomp's, which this oneDNN build runs its threads on
};

}  // namespace cyxwiz::dnnl_api
