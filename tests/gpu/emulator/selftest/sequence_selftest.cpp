// TEST DOUBLE, NOT GPU SUPPORT. Self-test of the library's sequence-layer methods (API 11) through the
// Api (cyxwiz_cuda_api) of a built libcyxwiz_cuda(_emulated).so, against references in double computed
// here: the embedding's gather (int64, int32 and float32 ids, invalid ones flagged) and its
// deterministic scatter-add (repeated ids, accumulating), layer norm forward and backward (rows of
// one and of several elements per thread, one and several row chunks), the masked softmax (causal or
// not, in place), the strided batched GEMM (every transpose, strided views, beta), and `capturing`.
//   g++ -std=c++17 -O1 -g -Wall -Wextra -Icpp tests/gpu/emulator/selftest/sequence_selftest.cpp -ldl
//     -o OUT/sequence_selftest && OUT/sequence_selftest build/emulator/libcyxwiz_cuda_emulated.so
// Prints the largest error of each check; exit status 0 when all are within tolerance.
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cyxwiz/cuda/api.h"

using cyxwiz::cuda::Api;
using cyxwiz::cuda::CopyKind;
using cyxwiz::cuda::ElemType;

namespace {

Api* api = nullptr;
int failures = 0;
std::mt19937 rng(4321);

void ok(const std::string& what, const std::string& status) {
  if (status.empty()) return;
  std::printf("FAILED %s: %s\n", what.c_str(), status.c_str());
  ++failures;
}

// Largest |got - want| / max(1, |want|), printed and checked against `tolerance`.
template <class G, class W>
void compare(const std::string& what, const std::vector<G>& got, const std::vector<W>& want, double tolerance) {
  double worst = got.size() == want.size() ? 0.0 : INFINITY;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    const double e = std::fabs(double(got[i]) - double(want[i])) / std::max(1.0, std::fabs(double(want[i])));
    worst = std::max(worst, std::isnan(e) ? INFINITY : e);
  }
  const bool good = worst <= tolerance;
  std::printf("%-52s max error %.3g%s\n", what.c_str(), worst, good ? "" : "  FAILED");
  failures += !good;
}

template <class T>
struct Buffer {
  T* p = nullptr;
  size_t n = 0;
  explicit Buffer(const std::vector<T>& v) : n(v.size()) {
    void* raw = nullptr;
    ok("malloc", api->malloc(0, std::max<size_t>(n, 1) * sizeof(T), &raw));
    p = static_cast<T*>(raw);
    if (n) ok("copy", api->copy(0, p, v.data(), n * sizeof(T), CopyKind::HostToDevice));
  }
  ~Buffer() { api->free(0, p); }
  std::vector<T> get() const {
    std::vector<T> v(n);
    ok("copy back", api->copy(0, v.data(), p, n * sizeof(T), CopyKind::DeviceToHost));
    return v;
  }
};

std::vector<float> randoms(size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// ---- embedding ----

template <class Id>
void testEmbedding(const char* name, ElemType type, std::vector<Id> ids, int64_t vocab, int64_t dim, int64_t bad) {
  const int64_t count = static_cast<int64_t>(ids.size());
  const std::vector<float> table = randoms(vocab * dim, -1.0f, 1.0f), g = randoms(count * dim, -1.0f, 1.0f);
  const std::vector<float> start = randoms(vocab * dim, -0.5f, 0.5f);
  auto valid = [&](int64_t i, int64_t* id) {
    const double v = static_cast<double>(ids[i]);
    *id = static_cast<int64_t>(v);
    return v >= 0 && v < vocab && std::floor(v) == v;
  };
  // dtable in double; ordered: float32 sums in position order, the order the API promises (exact).
  std::vector<double> out(count * dim, 0.0), dtable(start.begin(), start.end());
  std::vector<float> ordered = start;
  for (int rep = 0; rep < 2; ++rep) {
    for (int64_t i = 0; i < count; ++i) {
      int64_t id;
      if (!valid(i, &id)) continue;
      for (int64_t d = 0; d < dim; ++d) {
        out[i * dim + d] = table[id * dim + d];
        dtable[id * dim + d] += g[i * dim + d];
        ordered[id * dim + d] += g[i * dim + d];
      }
    }
  }
  Buffer<Id> di(ids);
  Buffer<float> dt(table), dout(std::vector<float>(count * dim, 7.0f)), dg(g), dgrad(start);
  Buffer<int64_t> first(std::vector<int64_t>{-5});
  ok(name, api->embeddingForward(0, di.p, type, dt.p, dout.p, count, vocab, dim, first.p));
  compare(std::string(name) + ": rows (invalid: zeros)", dout.get(), out, 0.0);
  compare(std::string(name) + ": first invalid position", first.get(), std::vector<int64_t>{bad}, 0.0);
  for (int rep = 0; rep < 2; ++rep) {  // accumulates: the references add twice
    ok(name, api->embeddingBackward(0, di.p, type, dg.p, dgrad.p, count, vocab, dim));
  }
  const std::vector<float> got = dgrad.get();
  compare(std::string(name) + ": table gradient, twice", got, dtable, 1e-5);
  compare(std::string(name) + ": the same, in position order", got, ordered, 0.0);
}

void testEmbeddings() {
  std::geometric_distribution<int64_t> repeats(0.2);
  std::vector<int64_t> ids64(300);
  for (auto& id : ids64) id = std::min<int64_t>(repeats(rng), 49);
  testEmbedding("embedding int64 (repeated ids)", ElemType::Int64, ids64, 50, 33, 300);
  std::vector<int64_t> bad64 = ids64;
  bad64[17] = 50;
  bad64[200] = -3;
  testEmbedding("embedding int64 (50 and -3 invalid)", ElemType::Int64, bad64, 50, 33, 17);
  std::vector<int32_t> ids32(120);
  for (auto& id : ids32) id = static_cast<int32_t>(repeats(rng) % 7);
  ids32[119] = 7;
  testEmbedding("embedding int32 (wide rows, last invalid)", ElemType::Int32, ids32, 7, 300, 119);
  std::vector<float> idsf(64);
  for (auto& id : idsf) id = static_cast<float>(repeats(rng) % 9);
  idsf[40] = 2.5f;
  idsf[50] = 1e30f;
  testEmbedding("embedding float32 (2.5 and 1e30 invalid)", ElemType::Float32, idsf, 9, 16, 40);
  // Many slices (embeddingSlices): a large vocabulary, a narrow row.
  std::vector<int64_t> wide(500);
  for (auto& id : wide) id = static_cast<int64_t>(rng() % 40000);
  testEmbedding("embedding, 40000 ids, 4 columns", ElemType::Int64, wide, 40000, 4, 500);
}

// ---- layer norm ----

void testLayerNorm(int64_t rows, int64_t dim, float offset) {
  const std::string name = "layerNorm " + std::to_string(rows) + " x " + std::to_string(dim);
  std::vector<float> x = randoms(rows * dim, -2.0f, 2.0f);
  for (float& v : x) v += offset;
  const std::vector<float> w = randoms(dim, 0.5f, 1.5f), b = randoms(dim, -0.5f, 0.5f);
  const std::vector<float> dy = randoms(rows * dim, -1.0f, 1.0f);
  const double eps = 1e-5;
  std::vector<double> y(rows * dim), dx(rows * dim), dw(dim, 0.25), db(dim, -0.25);
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0.0, var = 0.0;
    for (int64_t i = 0; i < dim; ++i) mean += x[r * dim + i];
    mean /= dim;
    for (int64_t i = 0; i < dim; ++i) var += (x[r * dim + i] - mean) * (x[r * dim + i] - mean);
    const double rstd = 1.0 / std::sqrt(var / dim + eps);
    double sumGw = 0.0, sumGwXhat = 0.0;
    for (int64_t i = 0; i < dim; ++i) {
      const double xhat = (x[r * dim + i] - mean) * rstd, gw = double(dy[r * dim + i]) * w[i];
      y[r * dim + i] = xhat * w[i] + b[i];
      sumGw += gw;
      sumGwXhat += gw * xhat;
      dw[i] += dy[r * dim + i] * xhat;
      db[i] += dy[r * dim + i];
    }
    for (int64_t i = 0; i < dim; ++i) {
      const double xhat = (x[r * dim + i] - mean) * rstd;
      dx[r * dim + i] = rstd * (double(dy[r * dim + i]) * w[i] - sumGw / dim - xhat * sumGwXhat / dim);
    }
  }
  const std::vector<float> none(static_cast<size_t>(rows * dim)), perRow(static_cast<size_t>(rows));
  Buffer<float> dX(x), dW(w), dB(b), dY(none), mean(perRow), rstd(perRow), g(dy), gx(none),
      gw(std::vector<float>(dim, 0.25f)), gb(std::vector<float>(dim, -0.25f));
  ok(name, api->layerNormForward(0, dX.p, dW.p, dB.p, dY.p, mean.p, rstd.p, rows, dim, eps));
  // The CPU module's float32 statistics: (x - mean) rstd is exact to a few ulps of xhat's scale.
  compare(name + ": forward", dY.get(), y, 2e-5 * (1.0 + std::fabs(offset) / 100.0));
  ok(name, api->layerNormBackward(0, dX.p, g.p, dW.p, mean.p, rstd.p, gx.p, gw.p, gb.p, rows, dim));
  compare(name + ": input gradient", gx.get(), dx, 1e-4 * (1.0 + std::fabs(offset) / 100.0));
  // xhat is float32, as the CPU module's: its rounding grows with the mean's magnitude.
  compare(name + ": weight gradient (accumulated)", gw.get(), dw,
          1e-5 * std::sqrt(double(rows)) * (1.0 + std::fabs(offset) / 100.0));
  compare(name + ": bias gradient (accumulated)", gb.get(), db, 1e-5);
}

// ---- masked softmax ----

void testSoftmax(int64_t mats, int64_t t, bool causal, bool inPlace) {
  const std::string name = std::string("maskedSoftmax ") + (causal ? "causal " : "") + std::to_string(mats) + " x " +
                           std::to_string(t) + (inPlace ? " in place" : "");
  std::vector<float> x = randoms(mats * t * t, -6.0f, 6.0f);
  x[1] = 90.0f;  // a large score: the maximum's subtraction
  std::vector<double> want(x.size(), 0.0);
  for (int64_t r = 0; r < mats * t; ++r) {
    const int64_t seen = causal ? r % t + 1 : t;
    double mx = -INFINITY, sum = 0.0;
    for (int64_t c = 0; c < seen; ++c) mx = std::max(mx, double(x[r * t + c]));
    for (int64_t c = 0; c < seen; ++c) sum += std::exp(x[r * t + c] - mx);
    for (int64_t c = 0; c < seen; ++c) want[r * t + c] = std::exp(x[r * t + c] - mx) / sum;
  }
  Buffer<float> in(x), out(std::vector<float>(x.size(), 7.0f));
  float* y = inPlace ? in.p : out.p;
  ok(name, api->maskedSoftmaxForward(0, in.p, y, mats * t, t, causal));
  compare(name, (inPlace ? in : out).get(), want, 1e-6);
}

// ---- strided batched GEMM ----

// Row-major reference of C_i = alpha op(A_i) op(B_i) + beta C_i.
void testBatchedGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t batch, float beta) {
  const std::string name = std::string("gemmStridedBatched ") + (ta ? "T" : "N") + (tb ? "T" : "N") + " " +
                           std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + " x" +
                           std::to_string(batch) + (beta != 0.0f ? " beta" : "");
  // Views into wider buffers (as attention's heads in the (N*T, 3E) projections): padded leading
  // dimensions and strides that interleave the batch's matrices.
  const int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
  const int64_t lda = ac * batch + 3, ldb = bc * batch + 1, ldc = n * batch + 2;
  const int64_t sa = ac, sb = bc, sc = n;
  std::vector<float> a = randoms(ar * lda, -1.0f, 1.0f), b = randoms(br * ldb, -1.0f, 1.0f),
                     c = randoms(m * ldc, -1.0f, 1.0f);
  const float alpha = 0.7f;
  std::vector<double> want(c.begin(), c.end());
  for (int64_t i = 0; i < batch; ++i) {
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0.0;
        for (int64_t l = 0; l < k; ++l) {
          const double av = ta ? a[l * lda + i * sa + r] : a[r * lda + i * sa + l];
          const double bv = tb ? b[j * ldb + i * sb + l] : b[l * ldb + i * sb + j];
          acc += av * bv;
        }
        double& out = want[r * ldc + i * sc + j];
        out = alpha * acc + beta * out;
      }
    }
  }
  Buffer<float> da(a), db(b), dc(c);
  ok(name, api->gemmStridedBatched(0, ta, tb, m, n, k, alpha, da.p, lda, sa, db.p, ldb, sb, beta, dc.p, ldc, sc, batch));
  compare(name, dc.get(), want, 1e-5);
}

void testCapturing() {
  const bool before = api->capturing(0);
  ok("graphBeginCapture", api->graphBeginCapture(0));
  const bool during = api->capturing(0);
  void* exec = nullptr;
  ok("graphEndCapture", api->graphEndCapture(0, &exec));
  if (exec) api->graphDestroy(exec);
  const bool after = api->capturing(0);
  const bool good = !before && during && !after;
  std::printf("%-52s %d %d %d%s\n", "capturing: before, during, after a capture", before, during, after,
              good ? "" : "  FAILED");
  failures += !good;
}

void testArgumentChecks() {
  auto expect = [](const std::string& status, const char* needle) {
    const bool good = status.find(needle) != std::string::npos;
    if (!good) std::printf("FAILED: expected \"%s\", got \"%s\"\n", needle, status.c_str());
    failures += !good;
  };
  float f = 0.0f;
  int64_t i = 0;
  expect(api->embeddingForward(0, &i, ElemType::Float64, &f, &f, 1, 2, 2, nullptr),
         "embeddingForward on cuda:0: ids must be Int64, Int32 or Float32");
  expect(api->embeddingForward(0, &i, ElemType::Int64, &f, &f, 1, 0, 2, nullptr), "vocab=0 must be positive");
  expect(api->embeddingBackward(0, nullptr, ElemType::Int64, &f, &f, 1, 2, 2), "embeddingBackward on cuda:0: ids is null");
  expect(api->layerNormForward(0, &f, &f, &f, &f, &f, &f, 1, 4, 0.0), "eps=");
  expect(api->layerNormBackward(0, &f, &f, nullptr, &f, &f, &f, nullptr, nullptr, 1, 4), "weight is null");
  expect(api->embeddingForward(0, nullptr, ElemType::Int64, nullptr, nullptr, 0, 2, 2, nullptr), "");
}

}  // namespace

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "build/emulator/libcyxwiz_cuda_emulated.so";
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::printf("cannot open %s: %s\n", path, dlerror());
    return 2;
  }
  using Entry = Api* (*)(int, const char**);
  const char* error = nullptr;
  api = reinterpret_cast<Entry>(dlsym(lib, "cyxwiz_cuda_api"))(cyxwiz::cuda::kApiVersion, &error);
  if (!api) {
    std::printf("cyxwiz_cuda_api: %s\n", error ? error : "null");
    return 2;
  }
  testEmbeddings();
  testLayerNorm(5, 8, 0.0f);
  testLayerNorm(70, 300, 1000.0f);  // several elements per thread, a large mean, 3 row chunks
  testLayerNorm(300, 24, 0.0f);     // 10 row chunks
  testSoftmax(3, 5, false, false);
  testSoftmax(3, 5, true, true);
  testSoftmax(2, 300, true, false);  // rows longer than a block
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) testBatchedGemm(ta, tb, 5, 4, 3, 3, 0.0f);
  }
  testBatchedGemm(false, true, 7, 7, 2, 4, 0.5f);
  testCapturing();
  testArgumentChecks();
  ok("synchronize", api->synchronize(0));
  if (auto errors = reinterpret_cast<int (*)()>(dlsym(lib, "cxemu_test_errors"))) {
    const int caught = errors();
    if (caught) std::printf("FAILED: the emulator caught %d illegal accesses\n", caught);
    failures += caught;
  }
  std::printf(failures ? "%d FAILED\n" : "all passed\n", failures);
  return failures ? 1 : 0;
}
