// rank_checks: one rank of a job that tests/test_cpp_ranks.py starts (3 ranks on 127.0.0.1), built
// against the installed CMake package `cyxwiz` like any C++ user's program. Plain C++17: no POSIX or
// Windows header, so that the same source builds with MinGW-w64 and runs under Wine.
//
//   rank_checks <mode> [argument]
//
// RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and CYXWIZ_TRANSPORT, CYXWIZ_SECRET,
// DISTRIBUTED_TIMEOUT_MS) come from the environment. Every check prints one line,
// "[rank r/N] PASS <what>" or "[rank r/N] FAIL <what>: <why>", and the last line is
// "[rank r/N] DONE <mode>: <p> passed, <f> failed". Exit status: 0 when every check passed, 1 when
// one failed, 2 for a bad command line. Modes:
//
//   collectives   every collective of the backend, every ReduceOp, every dtype, against a reference
//                 each rank computes itself (rank r's input is a pure function of r and the index)
//   killed V      rank V leaves with std::_Exit in the middle of a run of all-reduces; every other
//                 rank must fail with a NetworkError naming rank V ("ERROR ..." line), then fail
//                 again at once with the same error
//   stranger      a job that must form and compute correctly while a stranger talks to its port
//   secret ROLE   ROLE "refused": this rank's CYXWIZ_SECRET differs, init must refuse it naming the
//                 secret; ROLE "member": init (or the first collective) must fail within the timeout
//   ddp           DistributedDataParallel on each rank's shard ends where one process trained on the
//                 whole batch ends (float rounding), with the same bits on every rank
//   checkpoint    a checkpoint and a model file written, read back equal, replaced by second ones
//                 under the same names and read back equal again
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "cyxwiz/comm/process_group.h"
#include "cyxwiz/common/binary_io.h"
#include "cyxwiz/common/error.h"
#include "cyxwiz/ddp/checkpoint.h"
#include "cyxwiz/ddp/ddp.h"
#include "cyxwiz/nn/adam.h"
#include "cyxwiz/nn/cross_entropy.h"
#include "cyxwiz/nn/linear.h"
#include "cyxwiz/nn/model_file.h"
#include "cyxwiz/nn/relu.h"
#include "cyxwiz/nn/sequential.h"
#include "cyxwiz/tensor/half.h"
#include "cyxwiz/tensor/random.h"
#include "cyxwiz/tensor/tensor.h"

namespace {

using namespace cyxwiz;
using comm::ReduceOp;
using Clock = std::chrono::steady_clock;

// ------------------------------------------------------------------------------------- reporting

struct Report {
  int rank = 0, world = 1;
  int passed = 0, failed = 0;

  std::string prefix() const { return "[rank " + std::to_string(rank) + "/" + std::to_string(world) + "] "; }
  void line(const std::string& text) const {
    std::printf("%s%s\n", prefix().c_str(), text.c_str());
    std::fflush(stdout);
  }
  void pass(const std::string& what) {
    ++passed;
    line("PASS " + what);
  }
  void fail(const std::string& what, const std::string& why) {
    ++failed;
    line("FAIL " + what + ": " + why);
  }
  bool check(bool ok, const std::string& what, const std::string& why = "") {
    if (ok) pass(what);
    else fail(what, why.empty() ? "check failed" : why);
    return ok;
  }
  int finish(const std::string& mode) const {
    line("DONE " + mode + ": " + std::to_string(passed) + " passed, " + std::to_string(failed) + " failed");
    return failed == 0 ? 0 : 1;
  }
};

Report report;

double secondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The most specific class of the engine's error hierarchy (cyxwiz/common/error.h).
std::string errorClass(const std::exception& e) {
  if (dynamic_cast<const NetworkError*>(&e)) return "NetworkError";
  if (dynamic_cast<const TimeoutError*>(&e)) return "TimeoutError";
  if (dynamic_cast<const StoreError*>(&e)) return "StoreError";
  if (dynamic_cast<const BackendError*>(&e)) return "BackendError";
  if (dynamic_cast<const DistError*>(&e)) return "DistError";
  if (dynamic_cast<const InvalidArgument*>(&e)) return "InvalidArgument";
  if (dynamic_cast<const TypeMismatch*>(&e)) return "TypeMismatch";
  if (dynamic_cast<const FileFormatError*>(&e)) return "FileFormatError";
  if (dynamic_cast<const IoError*>(&e)) return "IoError";
  if (dynamic_cast<const Interrupted*>(&e)) return "Interrupted";
  if (dynamic_cast<const Error*>(&e)) return "Error";
  return "std::exception";
}

// ------------------------------------------------------------------------- deterministic inputs

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hashOf(int rank, int64_t index, uint64_t tag) {
  return mix(mix(mix(tag) ^ static_cast<uint64_t>(rank)) ^ static_cast<uint64_t>(index));
}

// A floating input: for SUM/AVG/MAX/MIN quarters in [-5, 5], for PRODUCT halves in [-2, 2]. Any sum
// or product of a few of them is exact even in bfloat16, so the order in which a transport combines
// the ranks cannot change a result and the reference is exact.
double smallValue(uint64_t h, ReduceOp op) {
  if (op == ReduceOp::Product) return (static_cast<double>(h % 9) - 4.0) * 0.5;
  return (static_cast<double>(h % 41) - 20.0) * 0.25;
}

const char* opName(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "SUM";
    case ReduceOp::Avg: return "AVG";
    case ReduceOp::Max: return "MAX";
    case ReduceOp::Min: return "MIN";
    case ReduceOp::Product: return "PRODUCT";
  }
  return "?";
}

const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min, ReduceOp::Product};

// Element kinds: S is how an element is stored; make() builds one from a hash; combine() is the
// reduction of two, average() the AVG's final step (wrapped integer sum / world size truncated
// toward zero; floats: sum / n in the element's arithmetic, 16-bit floats through float32).

template <typename T>
struct IntegerKind {
  using S = T;
  using U = std::make_unsigned_t<T>;
  // Arithmetic in an unsigned type at least as wide as int: wrapping is defined there.
  using W = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, U>;
  static constexpr DType dtype = DTypeOf<T>::value;
  static T fromBits(uint64_t bits) {  // modular, without implementation-defined conversions
    U u = static_cast<U>(bits);
    T t;
    std::memcpy(&t, &u, sizeof t);
    return t;
  }
  static S make(uint64_t h, ReduceOp) { return fromBits(h); }  // the whole range: sums wrap around
  static S combine(S a, S b, ReduceOp op) {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: return fromBits(static_cast<W>(static_cast<W>(a) + static_cast<W>(b)));
      case ReduceOp::Product: return fromBits(static_cast<W>(static_cast<W>(a) * static_cast<W>(b)));
      case ReduceOp::Max: return std::max(a, b);
      case ReduceOp::Min: return std::min(a, b);
    }
    return a;
  }
  static S average(S sum, int n) {
    if constexpr (std::is_signed_v<T>) return static_cast<T>(static_cast<int64_t>(sum) / n);  // toward zero
    else return static_cast<T>(static_cast<uint64_t>(sum) / static_cast<uint64_t>(n));
  }
  static bool same(S a, S b) { return a == b; }
  static std::string show(S v) {
    if constexpr (std::is_signed_v<T>) return std::to_string(static_cast<long long>(v));
    else return std::to_string(static_cast<unsigned long long>(v));
  }
};

template <typename T>
struct FloatKind {
  using S = T;
  static constexpr DType dtype = DTypeOf<T>::value;
  static S make(uint64_t h, ReduceOp op) { return static_cast<T>(smallValue(h, op)); }
  static S combine(S a, S b, ReduceOp op) {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: return a + b;
      case ReduceOp::Product: return a * b;
      case ReduceOp::Max: return std::max(a, b);
      case ReduceOp::Min: return std::min(a, b);
    }
    return a;
  }
  static S average(S sum, int n) { return sum / static_cast<T>(n); }
  static bool same(S a, S b) { return a == b; }
  static std::string show(S v) {
    char text[64];
    std::snprintf(text, sizeof text, "%.17g", static_cast<double>(v));
    return text;
  }
};

// float16 / bfloat16, stored as their bits.
template <DType D>
struct Float16Kind {
  using S = uint16_t;
  static constexpr DType dtype = D;
  static float load(S bits) { return D == DType::Float16 ? halfToFloat(bits) : bfloat16ToFloat(bits); }
  static S store(float f) { return D == DType::Float16 ? floatToHalf(f) : floatToBFloat16(f); }
  static S make(uint64_t h, ReduceOp op) { return store(static_cast<float>(smallValue(h, op))); }
  static S combine(S a, S b, ReduceOp op) { return store(FloatKind<float>::combine(load(a), load(b), op)); }
  static S average(S sum, int n) { return store(load(sum) / static_cast<float>(n)); }
  static bool same(S a, S b) { return a == b; }
  static std::string show(S v) {
    char text[64];
    std::snprintf(text, sizeof text, "%.9g (bits 0x%04x)", static_cast<double>(load(v)), static_cast<unsigned>(v));
    return text;
  }
};

// bool, stored as one byte 0/1: SUM and MAX are "any", PRODUCT and MIN "all"; AVG is refused.
struct BoolKind {
  using S = uint8_t;
  static constexpr DType dtype = DType::Bool;
  static S make(uint64_t h, ReduceOp op) {
    const bool any = op == ReduceOp::Sum || op == ReduceOp::Max;
    return (h % 10) < (any ? 3u : 8u) ? 1 : 0;  // mostly false for "any", mostly true for "all"
  }
  static S combine(S a, S b, ReduceOp op) {
    const bool any = op == ReduceOp::Sum || op == ReduceOp::Avg || op == ReduceOp::Max;
    return any ? static_cast<S>(a || b) : static_cast<S>(a && b);
  }
  static S average(S sum, int) { return sum; }
  static bool same(S a, S b) { return a == b; }
  static std::string show(S v) { return v ? "true" : "false"; }
};

// ---------------------------------------------------------------------------------- collectives

// numpy.array_split's parts of `count` elements over `n` ranks: (offset, size) of part `r`.
std::pair<int64_t, int64_t> part(int64_t count, int n, int r) {
  const int64_t base = count / n, extra = count % n;
  return {r * base + std::min<int64_t>(r, extra), base + (r < extra ? 1 : 0)};
}

template <class K>
class CollectiveChecks {
 public:
  using S = typename K::S;

  CollectiveChecks(comm::Backend& backend, std::vector<int64_t> counts)
      : b_(backend), rank_(backend.rank()), n_(backend.worldSize()), counts_(std::move(counts)) {}

  void run() {
    allReduce();
    reduceScatter();
    reduceScatterInPlace();
    allGatherInPlace();
    broadcast();
    allGather();
    gather();
    scatter();
    allToAll();
    pointToPoint();
    sharedBuffer();
  }

 private:
  const char* name() const { return dtypeNameCache_.c_str(); }

  // Rank r's element i of the input tagged `tag` for `op`.
  static S input(int r, int64_t i, ReduceOp op, uint64_t tag) {
    return K::make(hashOf(r, i, tag * 8 + static_cast<uint64_t>(op)), op);
  }
  S reduced(int64_t i, ReduceOp op, uint64_t tag) const {
    S acc = input(0, i, op, tag);
    for (int r = 1; r < n_; ++r) acc = K::combine(acc, input(r, i, op, tag), op);
    return op == ReduceOp::Avg ? K::average(acc, n_) : acc;
  }
  static S* at(const Tensor& t) { return static_cast<S*>(t.rawData()); }
  Tensor filled(int64_t count, int r, ReduceOp op, uint64_t tag) const {
    Tensor t = Tensor::empty({count}, K::dtype);
    for (int64_t i = 0; i < count; ++i) at(t)[i] = input(r, i, op, tag);
    return t;
  }
  // got[i] == want(i) for i < count; a failure names the first difference.
  bool same(const std::string& what, const Tensor& got, int64_t count, const std::function<S(int64_t)>& want) {
    ++calls_;
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < count; ++i) {
      if (!K::same(at(got)[i], want(i))) {
        if (first < 0) first = i;
        ++bad;
      }
    }
    if (bad == 0) return true;
    report.fail(what, std::to_string(bad) + " of " + std::to_string(count) + " elements wrong; first at " +
                          std::to_string(first) + ": got " + K::show(at(got)[first]) + ", expected " + K::show(want(first)));
    ++failures_;
    return false;
  }
  std::string label(const char* collective, int64_t count, const char* extra = "") const {
    return std::string(collective) + " " + dtypeName(K::dtype) + extra + " x" + std::to_string(count);
  }
  std::vector<ReduceOp> ops() const {
    std::vector<ReduceOp> out;
    for (ReduceOp op : kOps) {
      if (!(K::dtype == DType::Bool && op == ReduceOp::Avg)) out.push_back(op);
    }
    return out;
  }
  // One PASS line per collective and dtype (the failures were printed one by one).
  void summary(const char* collective) {
    const std::string what = std::string(collective) + " " + dtypeName(K::dtype);
    if (failures_ == 0) report.pass(what + " (" + std::to_string(calls_) + " checks)");
    calls_ = failures_ = 0;
  }

  void allReduce() {
    uint64_t tag = 1;
    for (ReduceOp op : ops()) {
      for (size_t c = 0; c < counts_.size(); ++c) {
        const int64_t count = counts_[c];
        Tensor t = filled(count, rank_, op, tag);
        const bool async = c % 2 == 1;  // both: run on the caller's thread, queued and waited for
        b_.allReduce(t, op, async)->wait();
        same(label("all_reduce", count, (std::string(" ") + opName(op) + (async ? " async" : "")).c_str()), t, count,
             [&](int64_t i) { return reduced(i, op, tag); });
      }
    }
    // Several in flight at once, waited for in reverse order.
    std::vector<Tensor> ts;
    std::vector<std::shared_ptr<comm::Work>> works;
    const std::vector<ReduceOp> all = ops();
    for (size_t k = 0; k < all.size(); ++k) ts.push_back(filled(1000 + static_cast<int64_t>(k), rank_, all[k], tag + 1));
    for (size_t k = 0; k < all.size(); ++k) works.push_back(b_.allReduce(ts[k], all[k], true));
    for (size_t k = all.size(); k-- > 0;) works[k]->wait();
    for (size_t k = 0; k < all.size(); ++k) {
      same(label("all_reduce", ts[k].numel(), (std::string(" ") + opName(all[k]) + " in flight together").c_str()), ts[k],
           ts[k].numel(), [&](int64_t i) { return reduced(i, all[k], tag + 1); });
    }
    summary("all_reduce");
  }

  void reduceScatter() {
    const uint64_t tag = 3;
    for (ReduceOp op : ops()) {
      for (int64_t count : counts_) {
        Tensor in = filled(count, rank_, op, tag);
        const auto [lo, size] = part(count, n_, rank_);
        Tensor out = Tensor::empty({size}, K::dtype);
        b_.reduceScatter(in, out, op, false)->wait();
        const std::string what = label("reduce_scatter", count, (std::string(" ") + opName(op)).c_str());
        same(what, out, size, [&, lo = lo](int64_t i) { return reduced(lo + i, op, tag); });
        same(what + " (input unchanged)", in, count, [&](int64_t i) { return input(rank_, i, op, tag); });
      }
    }
    summary("reduce_scatter");
  }

  void reduceScatterInPlace() {
    const uint64_t tag = 4;
    for (ReduceOp op : ops()) {
      for (int64_t count : counts_) {
        Tensor t = filled(count, rank_, op, tag);
        b_.reduceScatterInPlace(t, op, false)->wait();
        const auto [lo, size] = part(count, n_, rank_);
        Tensor mine = t.view(lo, {size});
        same(label("reduce_scatter (in place)", count, (std::string(" ") + opName(op)).c_str()), mine, size,
             [&, lo = lo](int64_t i) { return reduced(lo + i, op, tag); });
      }
    }
    summary("reduce_scatter (in place)");
  }

  void allGatherInPlace() {
    const uint64_t tag = 5;
    for (int64_t count : counts_) {
      // This rank's part holds its data; the others hold anything (here: other numbers).
      Tensor t = filled(count, rank_, ReduceOp::Sum, tag + 100);
      const auto [lo, size] = part(count, n_, rank_);
      for (int64_t i = lo; i < lo + size; ++i) at(t)[i] = input(rank_, i, ReduceOp::Sum, tag);
      b_.allGatherInPlace(t, false)->wait();
      same(label("all_gather (in place)", count), t, count, [&](int64_t i) {
        int owner = 0;
        while (owner + 1 < n_ && part(count, n_, owner + 1).first <= i) ++owner;
        return input(owner, i, ReduceOp::Sum, tag);
      });
    }
    summary("all_gather (in place)");
  }

  void broadcast() {
    for (int src = 0; src < n_; ++src) {
      const uint64_t tag = 10 + static_cast<uint64_t>(src);
      for (int64_t count : counts_) {
        Tensor t = filled(count, rank_, ReduceOp::Sum, tag);
        b_.broadcast(t, src, false)->wait();
        same(label("broadcast", count, (" from " + std::to_string(src)).c_str()), t, count,
             [&](int64_t i) { return input(src, i, ReduceOp::Sum, tag); });
      }
    }
    summary("broadcast");
  }

  void allGather() {
    const uint64_t tag = 20;
    for (int64_t count : counts_) {
      Tensor in = filled(count, rank_, ReduceOp::Sum, tag);
      Tensor out = Tensor::empty({n_, count}, K::dtype);
      b_.allGather(in, out, false)->wait();
      same(label("all_gather", count), out, n_ * count,
           [&](int64_t i) { return input(static_cast<int>(i / count), i % count, ReduceOp::Sum, tag); });
    }
    summary("all_gather");
  }

  void gather() {
    for (int dst = 0; dst < n_; ++dst) {
      const uint64_t tag = 30 + static_cast<uint64_t>(dst);
      for (int64_t count : counts_) {
        Tensor in = filled(count, rank_, ReduceOp::Sum, tag);
        Tensor out = rank_ == dst ? Tensor::empty({n_, count}, K::dtype) : Tensor();
        b_.gather(in, out, dst, false)->wait();
        if (rank_ == dst) {
          same(label("gather", count, (" to " + std::to_string(dst)).c_str()), out, n_ * count,
               [&](int64_t i) { return input(static_cast<int>(i / count), i % count, ReduceOp::Sum, tag); });
        } else {
          ++calls_;
        }
      }
    }
    summary("gather");
  }

  void scatter() {
    for (int src = 0; src < n_; ++src) {
      const uint64_t tag = 40 + static_cast<uint64_t>(src);
      for (int64_t count : counts_) {
        // Block q of rank src's input goes to rank q.
        Tensor in = rank_ == src ? filled(n_ * count, src, ReduceOp::Sum, tag) : Tensor();
        Tensor out = filled(count, rank_, ReduceOp::Sum, tag + 100);
        b_.scatter(in, out, src, false)->wait();
        same(label("scatter", count, (" from " + std::to_string(src)).c_str()), out, count,
             [&](int64_t i) { return input(src, rank_ * count + i, ReduceOp::Sum, tag); });
      }
    }
    summary("scatter");
  }

  // Uneven blocks, some empty: rank a sends rank b `blockSize(a, b)` elements, its element j being
  // input(a, b * 1000003 + j).
  void allToAll() {
    const uint64_t tag = 50;
    for (int64_t count : counts_) {
      auto blockSize = [&](int from, int to) { return (count * (from + 2 * to + 1)) % 5 + ((from + to) % 3 == 1 ? 0 : 1); };
      std::vector<int64_t> inCounts(n_), outCounts(n_);
      for (int q = 0; q < n_; ++q) {
        inCounts[q] = blockSize(rank_, q);
        outCounts[q] = blockSize(q, rank_);
      }
      int64_t inTotal = 0, outTotal = 0;
      for (int q = 0; q < n_; ++q) {
        inTotal += inCounts[q];
        outTotal += outCounts[q];
      }
      Tensor in = Tensor::empty({inTotal}, K::dtype), out = Tensor::empty({outTotal}, K::dtype);
      for (int q = 0, o = 0; q < n_; o += static_cast<int>(inCounts[q]), ++q) {
        for (int64_t j = 0; j < inCounts[q]; ++j) at(in)[o + j] = input(rank_, q * 1000003 + j, ReduceOp::Sum, tag);
      }
      b_.allToAll(in, out, inCounts, outCounts, false)->wait();
      std::vector<S> want;
      for (int q = 0; q < n_; ++q) {
        for (int64_t j = 0; j < outCounts[q]; ++j) want.push_back(input(q, rank_ * 1000003 + j, ReduceOp::Sum, tag));
      }
      same(label("all_to_all", outTotal, " uneven blocks"), out, outTotal, [&](int64_t i) { return want[i]; });
    }
    summary("all_to_all");
  }

  // A ring of sends (to the next rank) and receives (from the previous one), named and from any rank.
  void pointToPoint() {
    if (n_ < 2) return;
    const int next = (rank_ + 1) % n_, prev = (rank_ + n_ - 1) % n_;
    for (int64_t count : counts_) {
      for (int anySource = 0; anySource < 2; ++anySource) {
        const uint64_t tag = 60 + static_cast<uint64_t>(anySource);
        Tensor out = filled(count, rank_, ReduceOp::Sum, tag);
        Tensor in = Tensor::empty({count}, K::dtype);
        auto received = b_.recv(in, anySource ? -1 : prev, static_cast<int64_t>(tag));
        auto sent = b_.send(out, next, static_cast<int64_t>(tag));
        sent->wait();
        received->wait();
        const std::string what = label(anySource ? "recv (any source) <- send" : "recv <- send", count);
        same(what, in, count, [&](int64_t i) { return input(prev, i, ReduceOp::Sum, tag); });
        if (anySource && received->sourceRank() != prev) {
          report.fail(what, "source_rank " + std::to_string(received->sourceRank()) + ", expected " + std::to_string(prev));
          ++failures_;
        }
      }
    }
    summary("send/recv");
  }

  // A buffer in memory the ranks of this host share (DDP's buckets): all_reduce of the whole buffer
  // reads the peers' copies where they lie (window_collectives.h) when the transport is shm.
  void sharedBuffer() {
    const uint64_t tag = 70;
    for (int64_t count : {int64_t{1}, int64_t{5003}, counts_.back()}) {
      Tensor t = b_.sharedZeros(count, K::dtype);
      for (ReduceOp op : ops()) {
        for (int64_t i = 0; i < count; ++i) at(t)[i] = input(rank_, i, op, tag);
        b_.allReduce(t, op, false)->wait();
        same(label("all_reduce on a shared buffer", count, (std::string(" ") + opName(op)).c_str()), t, count,
             [&](int64_t i) { return reduced(i, op, tag); });
      }
    }
    summary("all_reduce on a shared buffer");
  }

  comm::Backend& b_;
  int rank_, n_;
  std::vector<int64_t> counts_;
  std::string dtypeNameCache_ = dtypeName(K::dtype);
  int calls_ = 0, failures_ = 0;
};

// AVG of a bool array is refused before anything is sent, naming the rank, the collective and the remedy.
void boolAverageIsRefused(comm::Backend& b) {
  Tensor t = Tensor::zeros({5}, DType::Bool);
  static_cast<uint8_t*>(t.rawData())[2] = 1;
  Tensor out = Tensor::zeros({5}, DType::Bool);
  // (name, what the message calls it, the call)
  const std::vector<std::tuple<const char*, const char*, std::function<void()>>> calls = {
      {"all_reduce", "all_reduce", [&] { b.allReduce(t, ReduceOp::Avg, false)->wait(); }},
      {"reduce_scatter", "reduce_scatter",
       [&] { b.reduceScatter(t, out.view(0, {part(5, b.worldSize(), b.rank()).second}), ReduceOp::Avg, false)->wait(); }},
      {"reduce_scatter (in place)", "reduce_scatter", [&] { b.reduceScatterInPlace(t, ReduceOp::Avg, false)->wait(); }},
  };
  for (const auto& [name, called, call] : calls) {
    const std::string what = std::string(name) + " AVG of bool is refused";
    try {
      call();
      report.fail(what, "it ran");
    } catch (const InvalidArgument& e) {
      // The Python tests' substrings, and the rank and collective in front ("[rank r/N] all_reduce: ...").
      const std::string msg = e.what();
      report.check(contains(msg, "ReduceOp.AVG of a bool array") && contains(msg, "ReduceOp.MAX") &&
                       contains(msg, report.prefix() + called + ":"),
                   what, "message: " + msg);
    }
  }
  const uint8_t* data = static_cast<const uint8_t*>(t.rawData());
  report.check(data[0] == 0 && data[2] == 1 && data[4] == 0, "a refused AVG left the bool array as it was");
}

int collectivesMode() {
  comm::init(comm::DistributedConfig::fromEnvironment());
  const comm::DistributedConfig config = comm::currentConfig("rank_checks");
  auto b = comm::backend("rank_checks");
  report.pass("init: " + config.describe() + ", backend " + b->name() + ", transport " + config.transport);
  if (const char* wanted = std::getenv("CYXWIZ_TRANSPORT"); wanted && std::string(wanted) != "auto") {
    report.check(config.transport == wanted, std::string("the job runs over ") + wanted, "get_config says " + config.transport);
  }
  // Both sides of each algorithm's thresholds: tiny, not divisible by the world size, 64 KiB, and
  // large enough for several ring slices (with CYXWIZ_RING_SLICE_BYTES small).
  const std::vector<int64_t> counts = {0, 1, 7, 4 * b->worldSize() + 1, 16385, 100003};
  boolAverageIsRefused(*b);
  CollectiveChecks<FloatKind<float>>(*b, counts).run();
  CollectiveChecks<FloatKind<double>>(*b, counts).run();
  CollectiveChecks<Float16Kind<DType::Float16>>(*b, counts).run();
  CollectiveChecks<Float16Kind<DType::BFloat16>>(*b, counts).run();
  CollectiveChecks<IntegerKind<int32_t>>(*b, counts).run();
  CollectiveChecks<IntegerKind<int64_t>>(*b, counts).run();
  CollectiveChecks<IntegerKind<int8_t>>(*b, counts).run();
  CollectiveChecks<IntegerKind<uint8_t>>(*b, counts).run();
  CollectiveChecks<IntegerKind<int16_t>>(*b, counts).run();
  CollectiveChecks<BoolKind>(*b, counts).run();
  b->barrier(false)->wait();
  report.pass("barrier");
  b.reset();
  comm::finalize();
  return report.finish("collectives");
}

// ------------------------------------------------------------------------------------ killed

int killedMode(int victim) {
  const comm::DistributedConfig config = comm::DistributedConfig::fromEnvironment();
  comm::init(config);
  auto b = comm::backend("rank_checks");
  Tensor a = Tensor::empty({1 << 18}, DType::Float32);  // 1 MB: the ring path, several steps a call
  for (int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = static_cast<float>(i % 1000);
  b->allReduce(a, ReduceOp::Max, false)->wait();  // MAX: the values stay what they are
  report.line("READY");
  if (report.rank == victim) {
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      report.line("EXITING with std::_Exit(41)");
      std::_Exit(41);  // no finalize, no goodbye, no destructors: as a crash
    }).detach();
    for (;;) b->allReduce(a, ReduceOp::Max, false)->wait();
  }
  const auto start = Clock::now();
  Clock::time_point t0;
  try {
    while (secondsSince(start) < 60) {
      t0 = Clock::now();
      b->allReduce(a, ReduceOp::Max, false)->wait();
    }
    report.fail("a collective fails once rank " + std::to_string(victim) + " is gone", "60 s of all-reduces went through");
    return report.finish("killed");
  } catch (const Error& e) {
    const double elapsed = secondsSince(t0);
    const std::string msg = e.what(), cls = errorClass(e);
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.3f", elapsed);
    report.line("ERROR " + cls + " after " + seconds + " s: " + msg);
    report.check(cls == "NetworkError", "the error is a NetworkError", "it is a " + cls);
    report.check(contains(msg, report.prefix() + "all_reduce #"), "the message starts with the call", msg);
    const std::string named = victim == 0 ? "lost the connection to rank 0" : "rank " + std::to_string(victim) + " (";
    report.check(contains(msg, named), "the message names rank " + std::to_string(victim), msg);
    report.check(elapsed * 1000.0 < static_cast<double>(config.timeoutMs),
                 "the error came within DISTRIBUTED_TIMEOUT_MS=" + std::to_string(config.timeoutMs),
                 std::string("after ") + seconds + " s");
    // The job is broken: the next collective fails at once with the same error.
    const auto t1 = Clock::now();
    try {
      b->allReduce(a, ReduceOp::Max, false)->wait();
      report.fail("the next collective fails too", "it succeeded");
    } catch (const Error& again) {
      report.check(errorClass(again) == cls && std::string(again.what()) == msg, "the next collective fails with the same error",
                   std::string(again.what()));
      report.check(secondsSince(t1) < 1.0, "the next collective fails at once", std::to_string(secondsSince(t1)) + " s");
    }
  }
  b.reset();
  comm::finalize();
  return report.finish("killed");
}

// ---------------------------------------------------------------------------------- stranger

int strangerMode() {
  const auto t0 = Clock::now();
  comm::init(comm::DistributedConfig::fromEnvironment());
  auto b = comm::backend("rank_checks");
  report.pass("init (" + std::to_string(secondsSince(t0)) + " s)");
  const int n = b->worldSize();
  Tensor x = Tensor::empty({5000}, DType::Float32);
  for (int64_t i = 0; i < 5000; ++i) x.data<float>()[i] = static_cast<float>((report.rank + 1) * (i % 100));
  b->allReduce(x, ReduceOp::Sum, false)->wait();
  bool ok = true;
  for (int64_t i = 0; i < 5000; ++i) ok = ok && x.data<float>()[i] == static_cast<float>(n * (n + 1) / 2 * (i % 100));
  report.check(ok, "all_reduce SUM float32 x5000");
  Tensor m = Tensor::empty({1}, DType::Int64);
  m.data<int64_t>()[0] = report.rank * 10;
  b->allReduce(m, ReduceOp::Max, false)->wait();
  report.check(m.data<int64_t>()[0] == (n - 1) * 10, "all_reduce MAX int64", std::to_string(m.data<int64_t>()[0]));
  b->barrier(false)->wait();
  report.pass("barrier");
  b.reset();
  comm::finalize();
  return report.finish("stranger");
}

// ------------------------------------------------------------------------------------ secret

int secretMode(const std::string& role) {
  const comm::DistributedConfig config = comm::DistributedConfig::fromEnvironment();
  const auto t0 = Clock::now();
  try {
    comm::init(config);
    auto b = comm::backend("rank_checks");
    Tensor x = Tensor::zeros({4}, DType::Float32);
    b->allReduce(x, ReduceOp::Sum, false)->wait();
    report.line("JOINED");
    report.fail("secret (" + role + ")", "the job formed and computed although one rank's CYXWIZ_SECRET differs");
    b.reset();
    comm::finalize();
  } catch (const Error& e) {
    const std::string msg = e.what(), cls = errorClass(e);
    const double elapsed = secondsSince(t0);
    report.line("ERROR " + cls + " after " + std::to_string(elapsed) + " s: " + msg);
    if (role == "refused") {
      report.check(cls == "StoreError", "refused: a StoreError", "a " + cls);
      report.check(contains(msg, "CYXWIZ_SECRET") && contains(msg, "refused this rank"),
                   "refused: the message names CYXWIZ_SECRET", msg);
    } else {
      report.check(dynamic_cast<const DistError*>(&e) != nullptr, "member: a DistError", "a " + cls);
    }
    // A little slack over the timeout: the rendezvous and the first collective each have one.
    report.check(elapsed * 1000.0 < 2.5 * static_cast<double>(config.timeoutMs) + 2000.0,
                 "the error came within the timeout", std::to_string(elapsed) + " s");
    comm::finalize();
  }
  return report.finish("secret");
}

// --------------------------------------------------------------------------------------- ddp

constexpr int64_t kIn = 20, kHidden = 16, kClasses = 5;

std::shared_ptr<nn::SequentialModel> buildModel(uint64_t seed) {
  manualSeed(seed);
  auto m = std::make_shared<nn::SequentialModel>();
  m->add(std::make_shared<nn::LinearModule>(kIn, kHidden));
  m->add(std::make_shared<nn::ReLUModule>());
  m->add(std::make_shared<nn::LinearModule>(kHidden, kClasses));
  return m;
}

// Rows [first, first + rows) of the global batch of `step`: features in [-1, 1), class labels.
std::pair<Tensor, Tensor> batchRows(int step, int64_t first, int64_t rows) {
  Tensor x = Tensor::empty({rows, kIn}, DType::Float32), y = Tensor::empty({rows}, DType::Int64);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < kIn; ++c) {
      const uint64_t h = hashOf(step, (first + r) * kIn + c, 1234);
      x.data<float>()[r * kIn + c] = static_cast<float>(h >> 40) * (2.0f / 16777216.0f) - 1.0f;
    }
    y.data<int64_t>()[r] = static_cast<int64_t>(hashOf(step, first + r, 4321) % kClasses);
  }
  return {x, y};
}

std::vector<float> flatParameters(const std::vector<nn::Parameter*>& params) {
  std::vector<float> out;
  for (const nn::Parameter* p : params) {
    const float* v = p->value.data<float>();
    out.insert(out.end(), v, v + p->value.numel());
  }
  return out;
}

// |got - want| <= atol + rtol |want| element by element (the Python tests' oracle: rtol 1e-5, atol 1e-6).
bool closeTo(const std::string& what, const std::vector<float>& got, const std::vector<float>& want, double rtol = 1e-5,
             double atol = 1e-6) {
  if (got.size() != want.size()) {
    report.fail(what, std::to_string(got.size()) + " values, expected " + std::to_string(want.size()));
    return false;
  }
  size_t bad = 0, first = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    worst = std::max(worst, d);
    if (!(d <= atol + rtol * std::fabs(static_cast<double>(want[i])))) {
      if (bad++ == 0) first = i;
    }
  }
  char values[120];
  std::snprintf(values, sizeof values, "got %.9g, expected %.9g; max abs diff %.3g", bad ? got[first] : 0.0f,
                bad ? want[first] : 0.0f, worst);
  if (bad == 0) {
    std::snprintf(values, sizeof values, ": max abs diff %.3g", worst);
    report.pass(what + values);
    return true;
  }
  report.fail(what, std::to_string(bad) + " of " + std::to_string(got.size()) + " values differ; first at " +
                        std::to_string(first) + ": " + values);
  return false;
}

// One process, the whole global batch each step: where N ranks on equal shards must end, since the
// mean gradient of equal shards averaged over the ranks is the mean gradient of the whole batch.
std::vector<float> singleProcess(int steps, int64_t rows) {
  auto m = buildModel(0);
  nn::AdamOptimizer opt(0.01);
  nn::CrossEntropyLoss loss;
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = batchRows(step, 0, rows);
    Tensor out = m->forward(x);
    m->zeroGrad();
    m->backward(loss.backward(out, y));
    opt.step(*m);
  }
  return flatParameters(m->parameters());
}

void ddpCase(comm::Backend& b, const std::string& name, ddp::DDPConfig cfg) {
  const int n = b.worldSize(), steps = 4;
  const int64_t perRank = 16, rows = perRank * n;
  auto model = buildModel(static_cast<uint64_t>(report.rank));  // broadcastParameters: rank 0's win
  ddp::DistributedDataParallel net(model, cfg);
  nn::AdamOptimizer opt(0.01);
  nn::CrossEntropyLoss loss;
  bool zeroed = true;
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = batchRows(step, report.rank * perRank, perRank);
    Tensor out = net.forward(x);
    net.backward(loss.backward(out, y));
    net.updateParameters(opt);
    for (nn::Parameter* p : net.parameters()) {
      for (int64_t i = 0; i < p->grad.numel(); ++i) zeroed = zeroed && p->grad.data<float>()[i] == 0.0f;
    }
  }
  report.check(zeroed, name + ": update_parameters zeroes the gradients");
  const std::vector<float> mine = flatParameters(net.parameters());
  report.check(mine != flatParameters(buildModel(0)->parameters()), name + ": training moved the parameters");
  closeTo(name + ": " + std::to_string(n) + " ranks x " + std::to_string(perRank) + " rows vs 1 process x " +
              std::to_string(rows) + " rows (rtol 1e-5, atol 1e-6)",
          mine, singleProcess(steps, rows));
  // Every rank holds the same bits.
  const int64_t count = static_cast<int64_t>(mine.size());
  Tensor in = Tensor::empty({count}, DType::Float32), all = Tensor::empty({n, count}, DType::Float32);
  std::memcpy(in.data<float>(), mine.data(), mine.size() * sizeof(float));
  b.allGather(in, all, false)->wait();
  bool identical = true;
  for (int r = 0; r < n; ++r) identical = identical && std::memcmp(all.data<float>() + r * count, mine.data(), mine.size() * 4) == 0;
  report.check(identical, name + ": the parameters are bit-identical on every rank");
}

int ddpMode() {
  comm::init(comm::DistributedConfig::fromEnvironment());
  auto b = comm::backend("rank_checks");
  ddpCase(*b, "DDP, default buckets", ddp::DDPConfig{});
  ddp::DDPConfig small;
  small.bucketSizeMb = 0.0001;  // ~100-byte buckets: several all-reduces a step
  ddpCase(*b, "DDP, tiny buckets", small);
  ddp::DDPConfig sharded;
  sharded.shardOptimizer = true;  // reduce-scatter, 1/N of the step, all-gather
  ddpCase(*b, "DDP, sharded optimizer step", sharded);
  b.reset();
  comm::finalize();
  return report.finish("ddp");
}

// -------------------------------------------------------------------------------- checkpoint

bool sameTensor(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.rawData(), b.rawData(), a.nbytes()) == 0;
}

bool sameParameters(const nn::SequentialModel& a, const nn::SequentialModel& b) {
  const auto pa = a.parameters(), pb = b.parameters();
  if (pa.size() != pb.size()) return false;
  for (size_t i = 0; i < pa.size(); ++i) {
    if (pa[i]->name != pb[i]->name || !sameTensor(pa[i]->value, pb[i]->value)) return false;
  }
  return true;
}

bool sameState(const ddp::TrainingState& a, const ddp::TrainingState& b) {
  if (a.epoch != b.epoch || a.worldSize != b.worldSize || a.optimizerType != b.optimizerType || a.rngStates != b.rngStates ||
      a.optimizer.scalars != b.optimizer.scalars || a.optimizer.tensors.size() != b.optimizer.tensors.size() ||
      a.history.trainLosses != b.history.trainLosses || a.history.trainAccuracies != b.history.trainAccuracies ||
      a.history.valLosses != b.history.valLosses || a.history.valAccuracies != b.history.valAccuracies) {
    return false;
  }
  for (const auto& [key, t] : a.optimizer.tensors) {
    auto it = b.optimizer.tensors.find(key);
    if (it == b.optimizer.tensors.end() || !sameTensor(t, it->second)) return false;
  }
  return true;
}

// The files in `dir` other than `keep`: a writer's temporary files left behind, for instance.
std::vector<std::string> strayFiles(const std::filesystem::path& dir, const std::vector<std::string>& keep) {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (std::find(keep.begin(), keep.end(), name) == keep.end()) out.push_back(name);
  }
  return out;
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out.empty() ? "none" : out;
}

int checkpointMode(const std::string& dirArg) {
  namespace fs = std::filesystem;
  comm::init(comm::DistributedConfig::fromEnvironment());
  auto b = comm::backend("rank_checks");
  const int rank = report.rank, n = b->worldSize();
  // Every rank writes its own files into one folder (relative paths: the same under Wine).
  const fs::path dir = fs::path(dirArg) / "checkpoints";
  fs::create_directories(dir);
  const std::string ckptName = ddp::checkpointFileName(1, rank);
  const std::string modelName = "model.rank" + std::to_string(rank) + ".cyxmodel";
  const fs::path ckptPath = dir / ckptName, modelPath = dir / modelName;

  auto model = buildModel(0);
  ddp::DistributedDataParallel net(model);
  nn::AdamOptimizer opt(0.01);
  nn::CrossEntropyLoss loss;
  ddp::TrainingHistory history;
  auto trainStep = [&](int step) {
    auto [x, y] = batchRows(step, rank * 8, 8);
    Tensor out = net.forward(x);
    history.trainLosses.push_back(loss.forward(out, y));
    history.trainAccuracies.push_back(nn::accuracy(out, y));
    net.backward(loss.backward(out, y));
    net.updateParameters(opt);
  };
  auto stateNow = [&](int64_t epoch) {
    ddp::TrainingState s;
    s.epoch = epoch;
    s.worldSize = n;
    s.optimizerType = opt.typeName();
    s.optimizer = net.optimizerState(opt);
    s.rngStates.assign(static_cast<size_t>(n), generatorState());
    s.history = history;
    return s;
  };

  std::vector<uint8_t> firstBytes;
  std::vector<std::string> keep = {ckptName, modelName};
  for (int version = 1; version <= 2; ++version) {
    const std::string v = version == 1 ? "written" : "replaced";
    trainStep(version);
    const ddp::TrainingState state = stateNow(version);
    // Checkpoint: the same path both times (the second write replaces the first file).
    ddp::TrainingState back;
    auto fresh = buildModel(99);
    try {
      writeContainer(ckptPath.string(), ddp::kCheckpointFileKind, ddp::encodeCheckpoint(*model, state));
      const std::vector<uint8_t> payload = readContainer(ckptPath.string(), ddp::kCheckpointFileKind);
      back = ddp::decodeCheckpoint(payload, ckptPath.string(), *fresh);
      report.check(sameParameters(*model, *fresh), "checkpoint " + v + ": the weights read back equal");
      report.check(sameState(state, back), "checkpoint " + v + ": epoch, optimizer state, RNG states and history read back equal");
      if (version == 1) firstBytes = payload;
      else report.check(payload != firstBytes, "checkpoint replaced: the file holds the second checkpoint, not the first");
    } catch (const Error& e) {
      report.fail("checkpoint " + v, errorClass(e) + ": " + e.what());
    }
    // Model file: the same again.
    try {
      nn::writeModelFile(modelPath.string(), *model);
      auto read = nn::readModelFile(modelPath.string());
      report.check(read->architectureFingerprint() == model->architectureFingerprint() && sameParameters(*model, *read),
                   "model file " + v + ": architecture and weights read back equal");
    } catch (const Error& e) {
      report.fail("model file " + v, errorClass(e) + ": " + e.what());
    }
    const std::vector<std::string> stray = strayFiles(dir, {});
    std::vector<std::string> mine;
    for (const std::string& s : stray) {
      if (contains(s, ".rank" + std::to_string(rank) + ".")) mine.push_back(s);
    }
    std::sort(mine.begin(), mine.end());
    std::vector<std::string> expected = keep;
    std::sort(expected.begin(), expected.end());
    report.check(mine == expected, "checkpoint " + v + ": this rank's files are exactly " + joined(expected),
                 "found " + joined(mine));
  }
  b->barrier(false)->wait();  // every rank's files are complete
  try {
    const std::string latest = ddp::latestCheckpoint(dir.string());
    report.check(fs::path(latest).filename().string() == ddp::checkpointFileName(1, 0),
                 "latestCheckpoint picks rank 0's checkpoint", "it picked '" + latest + "'");
  } catch (const Error& e) {
    report.fail("latestCheckpoint", errorClass(e) + ": " + e.what());
  }
  b->barrier(false)->wait();
  b.reset();
  comm::finalize();
  return report.finish("checkpoint");
}

int usage() {
  std::fprintf(stderr,
               "usage: rank_checks collectives | killed <victim rank> | stranger | secret refused|member | ddp | "
               "checkpoint [folder]\n(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment)\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string mode = argv[1];
  const std::string arg = argc > 2 ? argv[2] : "";
  // The rank's identity for the report, before init (which may be what fails).
  try {
    const comm::DistributedConfig c = comm::DistributedConfig::fromEnvironment();
    report.rank = c.rank;
    report.world = c.worldSize;
  } catch (const Error& e) {
    std::fprintf(stderr, "rank_checks: %s\n", e.what());
    return 2;
  }
  try {
    if (mode == "collectives") return collectivesMode();
    if (mode == "killed") return arg.empty() ? usage() : killedMode(std::atoi(arg.c_str()));
    if (mode == "stranger") return strangerMode();
    if (mode == "secret") return arg != "refused" && arg != "member" ? usage() : secretMode(arg);
    if (mode == "ddp") return ddpMode();
    if (mode == "checkpoint") return checkpointMode(arg.empty() ? "." : arg);
    return usage();
  } catch (const std::exception& e) {
    report.fail(mode, "unexpected " + errorClass(e) + ": " + e.what());
    report.finish(mode);
    comm::finalize();
    return 1;
  }
}
