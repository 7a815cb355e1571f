// The one implementation of cuda::Api. Its methods are defined by topic across the .cpp files of
// this directory (memory.cpp, blas.cpp, blas_lt.cpp, ops_*.cpp, graphs.cpp, nccl.cpp, api_impl.cpp);
// the kernels they launch are in the .cu files, behind launch.h, so that the tests' host emulator
// (tests/gpu/emulator) compiles every .cpp here unchanged.
#pragma once

#include "cyxwiz/cuda/api.h"

namespace cyxwiz::cuda {

class ApiImpl final : public Api {
 public:
  int apiVersion() const noexcept override;
  int cudaRuntimeVersion() const noexcept override;
  int ncclVersion() const noexcept override;
  int cublasVersion() const noexcept override;
  const char* architectures() const noexcept override;
  int cudnnVersion() const noexcept override;

  Status deviceCount(int* count) noexcept override;
  Status driverVersion(int* version) noexcept override;
  Status deviceProperties(int dev, DeviceProperties* out) noexcept override;
  Status pointerDevice(const void* ptr, int* dev) noexcept override;

  Status malloc(int dev, size_t bytes, void** out) noexcept override;
  void free(int dev, void* ptr) noexcept override;
  Status mallocHost(size_t bytes, void** out) noexcept override;
  void freeHost(void* ptr) noexcept override;
  Status copy(int dev, void* dst, const void* src, size_t bytes, CopyKind kind) noexcept override;
  Status memsetZero(int dev, void* dst, size_t bytes) noexcept override;
  Status fill(int dev, float* dst, int64_t n, float value) noexcept override;
  Status synchronize(int dev) noexcept override;
  Status query(int dev, bool* done) noexcept override;

  void setTF32(bool enabled) noexcept override;
  Status gemm(int dev, bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) noexcept override;
  Status broadcastRows(int dev, const float* row, float* out, int64_t rows, int64_t cols) noexcept override;
  Status addColumnSums(int dev, const float* g, float* out, int64_t rows, int64_t cols) noexcept override;
  Status activationForward(int dev, Activation f, const float* x, float* y, int64_t n, float param) noexcept override;
  Status activationBackward(int dev, Activation f, const float* x, const float* g, float* dx, int64_t n,
                            float param) noexcept override;
  Status multiply(int dev, const float* a, const float* b, float* out, int64_t n) noexcept override;
  Status add(int dev, const float* a, const float* b, float* out, int64_t n) noexcept override;

  // cudnn.cpp
  Status convForward(int dev, const ConvShape& s, const float* x, const float* w, const float* bias,
                     float* y) noexcept override;
  Status convBackwardData(int dev, const ConvShape& s, const float* dy, const float* w, float* dx) noexcept override;
  Status convBackwardFilter(int dev, const ConvShape& s, const float* x, const float* dy, float* dw,
                            float* db) noexcept override;
  Status poolForward(int dev, const PoolShape& s, const float* x, float* y) noexcept override;
  Status poolBackward(int dev, const PoolShape& s, const float* x, const float* y, const float* dy,
                      float* dx) noexcept override;

  // ops_batchnorm.cpp
  Status channelSums(int dev, const float* x, int64_t n, int64_t c, int64_t s, double* sums) noexcept override;
  Status channelSquaredDeviations(int dev, const float* x, int64_t n, int64_t c, int64_t s, const double* sums,
                                  double* squares) noexcept override;
  Status batchNormStatistics(int dev, int64_t c, const double* sums, const double* squares, double eps,
                             double momentum, float* runningMean, float* runningVar, int64_t* batchesTracked,
                             double* mean, double* invstd) noexcept override;
  Status batchNormApply(int dev, const float* x, float* y, int64_t n, int64_t c, int64_t s, const float* weight,
                        const float* bias, const double* mean, const double* invstd) noexcept override;
  Status batchNormGradSums(int dev, const float* x, const float* dy, int64_t n, int64_t c, int64_t s,
                           const double* mean, const double* invstd, double* gradSums, float* dweight,
                           float* dbias) noexcept override;
  Status batchNormBackward(int dev, const float* x, const float* dy, float* dx, int64_t n, int64_t c, int64_t s,
                           const float* weight, const double* mean, const double* invstd, const double* gradSums,
                           const double* count) noexcept override;
  Status dropoutForward(int dev, const float* x, float* y, float* mask, int64_t n, float keep, uint64_t seed,
                        const uint64_t* seedOnDevice) noexcept override;
  Status softmaxForward(int dev, const float* x, float* y, int64_t rows, int64_t cols) noexcept override;
  Status softmaxBackward(int dev, const float* y, const float* g, float* dx, int64_t rows,
                         int64_t cols) noexcept override;
  Status crossEntropyForward(int dev, const float* logits, const int64_t* labels, const float* probs, int64_t rows,
                             int64_t classes, int64_t ignoreIndex, double scale, double* sum) noexcept override;
  Status crossEntropyBackward(int dev, const float* logits, const int64_t* labels, const float* probs, float* grad,
                              int64_t rows, int64_t classes, int64_t ignoreIndex) noexcept override;
  Status mseForward(int dev, const float* y, const float* t, int64_t n, double scale, double* sum) noexcept override;
  Status mseBackward(int dev, const float* y, const float* t, float* grad, int64_t n) noexcept override;
  Status countCorrect(int dev, const float* logits, const int64_t* labels, const float* probs, int64_t rows,
                      int64_t classes, int64_t ignoreIndex, double* sum) noexcept override;
  Status linearForward(int dev, const float* x, const float* w, const float* bias, float* y, int64_t rows, int64_t in,
                       int64_t out, bool relu) noexcept override;
  Status convertFloats(int dev, const void* in, ElemType inType, void* out, ElemType outType, int64_t n,
                       float scale) noexcept override;

  Status gemm16(int dev, ElemType type, bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha,
                const void* a, int64_t lda, const void* b, int64_t ldb, float beta, float* c,
                int64_t ldc) noexcept override;
  Status linearForward16(int dev, ElemType type, const void* x, const void* w, const float* bias, float* y,
                         int64_t rows, int64_t in, int64_t out, bool relu) noexcept override;
  Status reluBackward16(int dev, ElemType type, const void* x, const float* g, float* dx, int64_t n) noexcept override;
  Status addColumnSums16(int dev, ElemType type, const void* g, float* out, int64_t rows,
                         int64_t cols) noexcept override;
  Status scaleFloats(int dev, const float* in, float* out, int64_t n, float factor, float* nonFinite) noexcept override;

  // blas.cpp
  Status gemmStridedBatched(int dev, bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha,
                            const float* a, int64_t lda, int64_t strideA, const float* b, int64_t ldb, int64_t strideB,
                            float beta, float* c, int64_t ldc, int64_t strideC, int64_t batch) noexcept override;
  // ops_embedding.cpp, ops_layernorm.cpp, ops_attention.cpp
  Status embeddingForward(int dev, const void* ids, ElemType idType, const float* table, float* out, int64_t count,
                          int64_t vocab, int64_t dim, int64_t* firstBad) noexcept override;
  Status embeddingBackward(int dev, const void* ids, ElemType idType, const float* g, float* dtable, int64_t count,
                           int64_t vocab, int64_t dim) noexcept override;
  Status layerNormForward(int dev, const float* x, const float* weight, const float* bias, float* y, float* mean,
                          float* rstd, int64_t rows, int64_t dim, double eps) noexcept override;
  Status layerNormBackward(int dev, const float* x, const float* dy, const float* weight, const float* mean,
                           const float* rstd, float* dx, float* dweight, float* dbias, int64_t rows,
                           int64_t dim) noexcept override;
  Status maskedSoftmaxForward(int dev, const float* x, float* y, int64_t rows, int64_t cols,
                              bool causal) noexcept override;
  // graphs.cpp
  bool capturing(int dev) noexcept override;

  Status sgdStep(int dev, const OptimizerTensor* tensors, int count, float lr, float momentum, float weightDecay,
                 bool nesterov, const float* scalars) noexcept override;
  Status adamStep(int dev, const OptimizerTensor* tensors, int count, float stepSize, float b1, float b2, float eps,
                  float invSqrtBc2, float l2, float decay, const float* scalars) noexcept override;

  Status graphBeginCapture(int dev) noexcept override;
  Status graphEndCapture(int dev, void** graphExec) noexcept override;
  Status graphLaunch(int dev, void* graphExec) noexcept override;
  void graphDestroy(void* graphExec) noexcept override;
  Status recordComputeEvent(int dev, void** event) noexcept override;

  Status commWaitsForCompute(int dev) noexcept override;
  Status computeWaitsFor(int dev, void* event) noexcept override;
  Status computeWaitsForStream(int dev, uintptr_t stream) noexcept override;
  Status eventQuery(void* event, bool* done) noexcept override;
  void eventRelease(void* event) noexcept override;

  Status ncclUniqueId(std::string* id) noexcept override;
  Status ncclInit(int dev, int nranks, int rank, const std::string& id, void** comm) noexcept override;
  Status ncclState(void* comm, bool* inProgress) noexcept override;
  Status ncclCollective(void* comm, int dev, CollectiveKind kind, const void* send, void* recv, size_t count,
                        ElemType type, ReduceKind op, int root) noexcept override;
  Status recordCommEvent(int dev, void** event) noexcept override;
  void ncclAbort(void* comm) noexcept override;
  void ncclDestroy(void* comm) noexcept override;
};

}  // namespace cyxwiz::cuda
