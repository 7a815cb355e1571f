// TEST DOUBLE, NOT GPU SUPPORT. Self-test of the library's new element-wise and batch-norm methods
// through the Api (cyxwiz_cuda_api) of a built libcyxwiz_cuda(_emulated).so, against references in
// double computed here: activations with their `param`, add in place, and every batch-norm call in
// training and eval, for shapes whose reductions run in one block per channel and split over several.
//   g++ -std=c++17 -O1 -g -Wall -Wextra -Icpp tests/gpu/emulator/selftest/batchnorm_selftest.cpp -ldl
//     -o OUT/batchnorm_selftest && OUT/batchnorm_selftest build/emulator/libcyxwiz_cuda_emulated.so
// Prints the largest error of each check; exit status 0 when all are within tolerance.
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cyxwiz/cuda/api.h"

using cyxwiz::cuda::Activation;
using cyxwiz::cuda::Api;
using cyxwiz::cuda::CopyKind;

namespace {

Api* api = nullptr;
int failures = 0;
std::mt19937 rng(1234);

void ok(const std::string& what, const std::string& status) {
  if (status.empty()) return;
  std::printf("FAILED %s: %s\n", what.c_str(), status.c_str());
  ++failures;
}

// Largest |got - want| / max(1, |want|), printed and checked against `tolerance`.
template <class G, class W>
void compare(const std::string& what, const std::vector<G>& got, const std::vector<W>& want, double tolerance) {
  double worst = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = std::fabs(double(got[i]) - double(want[i])) / std::max(1.0, std::fabs(double(want[i])));
    worst = std::max(worst, std::isnan(e) ? INFINITY : e);
  }
  const bool good = worst <= tolerance;
  std::printf("%-46s max error %.3g%s\n", what.c_str(), worst, good ? "" : "  FAILED");
  failures += !good;
}

// A device buffer holding `v`; read back with get().
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

template <class T>
std::vector<T> zeros(int64_t n) {
  return std::vector<T>(static_cast<size_t>(n));
}

std::vector<float> randoms(size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// The CPU modules' formulas (nn/activations.cpp), in double.
double sigmoidRef(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double softplusRef(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }

double value(Activation f, double x, double p) {
  switch (f) {
    case Activation::LeakyReLU: return x > 0 ? x : p * x;
    case Activation::ELU: return x > 0 ? x : p * std::expm1(x);
    case Activation::Swish: return x * sigmoidRef(x);
    case Activation::Mish: return x * std::tanh(softplusRef(x));
    default: return x > 0 ? x : 0.0;  // ReLU
  }
}

double derivative(Activation f, double x, double p) {
  switch (f) {
    case Activation::LeakyReLU: return x > 0 ? 1.0 : p;
    case Activation::ELU: return x > 0 ? 1.0 : p * std::exp(x);
    case Activation::Swish: {
      const double s = sigmoidRef(x);
      return s * (1.0 + x * (1.0 - s));
    }
    case Activation::Mish: {
      const double t = std::tanh(softplusRef(x));
      return t + x * sigmoidRef(x) * (1.0 - t * t);
    }
    default: return x > 0 ? 1.0 : 0.0;
  }
}

void testActivations() {
  std::vector<float> x = randoms(1000, -8.0f, 8.0f);
  x.insert(x.end(), {0.0f, -0.0f, 19.9f, 20.0f, 20.1f, 25.0f, -25.0f, -90.0f, 90.0f});
  const std::vector<float> g = randoms(x.size(), -2.0f, 2.0f);
  const int n = static_cast<int>(x.size());
  const struct {
    Activation f;
    const char* name;
    float param;
  } cases[] = {{Activation::ReLU, "ReLU", 0.0f},       {Activation::LeakyReLU, "LeakyReLU(0.01)", 0.01f},
               {Activation::LeakyReLU, "LeakyReLU(-0.3)", -0.3f}, {Activation::ELU, "ELU(1)", 1.0f},
               {Activation::ELU, "ELU(0.5)", 0.5f},    {Activation::Swish, "Swish", 0.0f},
               {Activation::Mish, "Mish", 0.0f}};
  for (const auto& c : cases) {
    Buffer<float> dx(x), dg(g), out(zeros<float>(int64_t(x.size())));
    std::vector<double> y(x.size()), d(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      y[i] = value(c.f, x[i], c.param);
      d[i] = g[i] * derivative(c.f, x[i], c.param);
    }
    ok(c.name, api->activationForward(0, c.f, dx.p, out.p, n, c.param));
    compare(std::string(c.name) + " forward", out.get(), y, 2e-6);
    ok(c.name, api->activationBackward(0, c.f, dx.p, dg.p, out.p, n, c.param));
    compare(std::string(c.name) + " backward", out.get(), d, 2e-6);
  }
  const std::string unknown = api->activationForward(0, static_cast<Activation>(8), nullptr, nullptr, 1, 0.0f);
  if (unknown.find("activationForward on cuda:0") == std::string::npos) ++failures;
}

void testAdd() {
  const std::vector<float> a = randoms(777, -3.0f, 3.0f), b = randoms(777, -3.0f, 3.0f);
  std::vector<float> sum(a.size());
  for (size_t i = 0; i < a.size(); ++i) sum[i] = a[i] + b[i];
  Buffer<float> da(a), db(b), out(zeros<float>(int64_t(a.size())));
  ok("add", api->add(0, da.p, db.p, out.p, 777));
  compare("add", out.get(), sum, 0.0);
  ok("add", api->add(0, da.p, db.p, da.p, 777));  // out = a
  compare("add in place (out = a)", da.get(), sum, 0.0);
  ok("add", api->add(0, da.p, db.p, db.p, 777));  // out = b: a + b + b
  std::vector<float> twice(a.size());
  for (size_t i = 0; i < a.size(); ++i) twice[i] = sum[i] + b[i];
  compare("add in place (out = b)", db.get(), twice, 0.0);
}

// One training step and one eval pass of batch norm over x (n, c, s), each call against double references.
void testBatchNorm(int64_t n, int64_t c, int64_t s, float offset) {
  const std::string shape = "(" + std::to_string(n) + "," + std::to_string(c) + "," + std::to_string(s) + ") ";
  const int64_t total = n * c * s, count = n * s;
  const double eps = 1e-5, momentum = 0.1;
  const std::vector<float> x = randoms(total, offset - 2.0f, offset + 2.0f), dy = randoms(total, -1.0f, 1.0f);
  const std::vector<float> w = randoms(c, 0.5f, 1.5f), b = randoms(c, -0.5f, 0.5f);
  const std::vector<float> rm0 = randoms(c, -0.2f, 0.2f), rv0 = randoms(c, 0.5f, 2.0f);
  const std::vector<float> dw0 = randoms(c, -0.1f, 0.1f), db0 = randoms(c, -0.1f, 0.1f);
  auto at = [&](const std::vector<float>& v, int64_t i, int64_t ch, int64_t j) {
    return double(v[(i * c + ch) * s + j]);
  };

  // References.
  std::vector<double> sums(c + 1, 0.0), squares(c, 0.0), mean(c), invstd(c), grad(2 * c, 0.0);
  std::vector<double> rm(c), rv(c), y(total), dx(total), dw(c), db(c), yEval(total), dxEval(total);
  std::vector<double> meanEval(c), invstdEval(c);
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < s; ++j) sums[ch] += at(x, i, ch, j);
    mean[ch] = sums[ch] / count;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < s; ++j) squares[ch] += (at(x, i, ch, j) - mean[ch]) * (at(x, i, ch, j) - mean[ch]);
    const double var = squares[ch] / count;
    invstd[ch] = 1.0 / std::sqrt(var + eps);
    rm[ch] = (1 - momentum) * rm0[ch] + momentum * mean[ch];
    rv[ch] = (1 - momentum) * rv0[ch] + momentum * var * count / (count - 1.0);
    meanEval[ch] = rm0[ch];
    invstdEval[ch] = 1.0 / std::sqrt(double(rv0[ch]) + eps);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < s; ++j) {
        const double xhat = (at(x, i, ch, j) - mean[ch]) * invstd[ch];
        grad[ch] += at(dy, i, ch, j);
        grad[c + ch] += at(dy, i, ch, j) * xhat;
        y[(i * c + ch) * s + j] = xhat * w[ch] + b[ch];
        yEval[(i * c + ch) * s + j] = (at(x, i, ch, j) - meanEval[ch]) * invstdEval[ch] * w[ch] + b[ch];
        dxEval[(i * c + ch) * s + j] = w[ch] * invstdEval[ch] * at(dy, i, ch, j);
      }
    }
    dw[ch] = dw0[ch] + grad[c + ch];
    db[ch] = db0[ch] + grad[ch];
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < s; ++j) {
        const double xhat = (at(x, i, ch, j) - mean[ch]) * invstd[ch];
        const double meanDy = grad[ch] / count, meanDyXhat = grad[c + ch] / count;
        dx[(i * c + ch) * s + j] = w[ch] * invstd[ch] * (at(dy, i, ch, j) - meanDy - xhat * meanDyXhat);
      }
    }
  }
  sums[c] = double(count);

  // Training.
  Buffer<float> dX(x), dDy(dy), dW(w), dB(b), dRm(rm0), dRv(rv0), dDw(dw0), dDb(db0), dY(zeros<float>(total)),
      dDx(zeros<float>(total));
  Buffer<double> dSums(zeros<double>(c + 1)), dSquares(zeros<double>(c)), dMean(zeros<double>(c)),
      dInvstd(zeros<double>(c)), dGrad(zeros<double>(2 * c));
  Buffer<int64_t> dTracked(std::vector<int64_t>{41});
  ok("channelSums", api->channelSums(0, dX.p, n, c, s, dSums.p));
  compare(shape + "channelSums", dSums.get(), sums, 1e-12);
  ok("channelSquaredDeviations", api->channelSquaredDeviations(0, dX.p, n, c, s, dSums.p, dSquares.p));
  compare(shape + "channelSquaredDeviations", dSquares.get(), squares, 1e-12);
  ok("batchNormStatistics", api->batchNormStatistics(0, c, dSums.p, dSquares.p, eps, momentum, dRm.p, dRv.p,
                                                     dTracked.p, dMean.p, dInvstd.p));
  compare(shape + "training mean", dMean.get(), mean, 1e-12);
  compare(shape + "training invstd", dInvstd.get(), invstd, 1e-12);
  compare(shape + "running mean", dRm.get(), rm, 1e-7);
  compare(shape + "running var", dRv.get(), rv, 1e-7);
  compare(shape + "batches tracked", dTracked.get(), std::vector<int64_t>{42}, 0.0);
  ok("batchNormApply", api->batchNormApply(0, dX.p, dY.p, n, c, s, dW.p, dB.p, dMean.p, dInvstd.p));
  // y = x scale + shift in float, as the CPU: a large mean costs a few ulp of |x scale| to cancellation.
  const double applyTolerance = 2e-6 + 3e-7 * std::fabs(offset);
  compare(shape + "training apply", dY.get(), y, applyTolerance);
  ok("batchNormGradSums",
     api->batchNormGradSums(0, dX.p, dDy.p, n, c, s, dMean.p, dInvstd.p, dGrad.p, dDw.p, dDb.p));
  compare(shape + "gradSums", dGrad.get(), grad, 1e-12);
  compare(shape + "dweight", dDw.get(), dw, 1e-6);
  compare(shape + "dbias", dDb.get(), db, 1e-6);
  ok("batchNormBackward", api->batchNormBackward(0, dX.p, dDy.p, dDx.p, n, c, s, dW.p, dMean.p, dInvstd.p, dGrad.p,
                                                 dSums.p + c));
  compare(shape + "training backward", dDx.get(), dx, 2e-6);

  // Eval: statistics from the running ones (reset to rm0, rv0); nothing else changes.
  Buffer<float> eRm(rm0), eRv(rv0);
  ok("batchNormStatistics eval", api->batchNormStatistics(0, c, nullptr, nullptr, eps, momentum, eRm.p, eRv.p,
                                                          nullptr, dMean.p, dInvstd.p));
  compare(shape + "eval mean", dMean.get(), meanEval, 0.0);
  compare(shape + "eval invstd", dInvstd.get(), invstdEval, 1e-15);
  compare(shape + "eval running mean unchanged", eRm.get(), rm0, 0.0);
  ok("batchNormApply eval", api->batchNormApply(0, dX.p, dY.p, n, c, s, dW.p, dB.p, dMean.p, dInvstd.p));
  compare(shape + "eval apply", dY.get(), yEval, applyTolerance);
  ok("batchNormBackward eval", api->batchNormBackward(0, dX.p, dDy.p, dDx.p, n, c, s, dW.p, dMean.p, dInvstd.p,
                                                      nullptr, nullptr));
  compare(shape + "eval backward", dDx.get(), dxEval, 2e-6);
}

// A rank's empty share of a synchronised batch: zero sums, count, squares and gradient sums.
void testEmptyBatch() {
  Buffer<double> sums(std::vector<double>(4, 7.0)), squares(std::vector<double>(3, 7.0)),
      grad(std::vector<double>(6, 7.0)), mean(std::vector<double>(3, 0.5)), invstd(std::vector<double>(3, 2.0));
  Buffer<float> dw(std::vector<float>(3, 1.5f));
  ok("channelSums empty", api->channelSums(0, nullptr, 0, 3, 5, sums.p));
  ok("channelSquaredDeviations empty", api->channelSquaredDeviations(0, nullptr, 0, 3, 5, sums.p, squares.p));
  ok("batchNormGradSums empty",
     api->batchNormGradSums(0, nullptr, nullptr, 0, 3, 5, mean.p, invstd.p, grad.p, dw.p, nullptr));
  compare("empty batch: sums and count", sums.get(), std::vector<double>(4, 0.0), 0.0);
  compare("empty batch: squares", squares.get(), std::vector<double>(3, 0.0), 0.0);
  compare("empty batch: gradSums", grad.get(), std::vector<double>(6, 0.0), 0.0);
  compare("empty batch: dweight unchanged", dw.get(), std::vector<float>(3, 1.5f), 0.0);
}

void testArgumentChecks() {
  auto expect = [](const std::string& status, const char* needle) {
    const bool good = status.find(needle) != std::string::npos;
    if (!good) std::printf("FAILED: expected \"%s\", got \"%s\"\n", needle, status.c_str());
    failures += !good;
  };
  double d = 0.0;
  float f = 0.0f;
  expect(api->channelSums(0, &f, -1, 2, 3, &d), "channelSums on cuda:0: shape (n=-1, c=2, s=3) must be non-negative");
  expect(api->channelSums(0, &f, 2, 0, 3, &d), "with c > 0");
  expect(api->channelSums(0, nullptr, 1, 2, 3, &d), "channelSums on cuda:0: x is null");
  expect(api->batchNormStatistics(0, 2, &d, nullptr, 1e-5, 0.1, &f, &f, nullptr, &d, &d),
         "batchNormStatistics on cuda:0: squares is null");
  expect(api->batchNormStatistics(0, 2, &d, &d, 0.0, 0.1, &f, &f, nullptr, &d, &d), "eps=");
  expect(api->batchNormBackward(0, &f, &f, &f, 1, 1, 1, &f, &d, &d, nullptr, &d), "gradSums is null");
  expect(api->batchNormApply(0, nullptr, nullptr, 0, 4, 4, nullptr, nullptr, nullptr, nullptr), "");
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
  testActivations();
  testAdd();
  testBatchNorm(3, 5, 7, 0.0f);
  testBatchNorm(3, 5, 1, 0.0f);
  testBatchNorm(40, 3, 1000, 100.0f);  // several blocks per channel (splits > 1), a large mean
  testBatchNorm(700, 2, 1, 0.0f);      // s = 1 with a step of whole rows
  testBatchNorm(4, 600, 2, 0.0f);      // 2 c > kMaxPartials: the gradient sums in one block per channel
  testEmptyBatch();
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
