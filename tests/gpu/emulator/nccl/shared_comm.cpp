// TEST DOUBLE, NOT GPU SUPPORT. The emulated NCCL's transport between processes: see shared_comm.h.
#include "nccl/shared_comm.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

#include "cyxwiz/cuda/kernel_math.h"  // the 16-bit conversions, bit for bit cyxwiz/tensor/half.h's
#include "nccl/text.h"

namespace cxemu::nccl {

namespace {

constexpr char kUniqueIdTag[] = "pycyxwiz-emulated-nccl-id:";
constexpr size_t kTagBytes = sizeof kUniqueIdTag - 1;
constexpr size_t kTokenDigits = 32;  // 16 random bytes in hex
constexpr uint64_t kMagic = 0x43595857454d5531ull;  // "CYXWEMU1"
constexpr int64_t kDefaultTimeoutMs = 30000;        // the engine's default DISTRIBUTED_TIMEOUT_MS
// Staging per rank: 8 MiB (larger collectives go in phases), less in big worlds so that a segment
// stays within 64 MiB, the /dev/shm of a default Docker container.
constexpr size_t kMaxSlotBytes = size_t(8) << 20;
constexpr size_t kMinSlotBytes = size_t(256) << 10;
constexpr size_t kSegmentBudget = size_t(64) << 20;
constexpr size_t kPage = 4096;

// A rank's presence in the segment.
enum : int32_t { kAbsent = 0, kJoined = 1, kLeft = 2, kAborted = 3 };

int64_t nowNs() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return int64_t(t.tv_sec) * 1000000000 + t.tv_nsec;
}

// The engine's DISTRIBUTED_TIMEOUT_MS, so that a collective never blocks the engine longer than the
// engine's own deadline for it; 30 s (the engine's default) when unset or not a positive integer.
int64_t timeoutFromEnvironment() {
  const char* env = std::getenv("DISTRIBUTED_TIMEOUT_MS");
  if (!env || !*env) return kDefaultTimeoutMs;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(env, &end, 10);
  if (errno || *end || v <= 0) return kDefaultTimeoutMs;
  return v;
}

const char* typeName(ncclDataType_t t) {
  switch (t) {
    case ncclFloat32: return "float32";
    case ncclFloat64: return "float64";
    case ncclInt32: return "int32";
    case ncclInt64: return "int64";
    case ncclFloat16: return "float16";
    case ncclBfloat16: return "bfloat16";
    default: return "?";
  }
}

const char* opName(ncclRedOp_t op) {
  switch (op) {
    case ncclSum: return "sum";
    case ncclAvg: return "avg";
    case ncclMax: return "max";
    case ncclMin: return "min";
    case ncclProd: return "product";
    default: return "?";
  }
}

bool reduces(CollectiveKind k) { return k == CollectiveKind::AllReduce || k == CollectiveKind::ReduceScatter; }

// "ncclAllReduce #3 (float32, sum, 1000 elements)"
std::string describe(CollectiveKind kind, ncclDataType_t type, ncclRedOp_t op, int root, uint64_t count, uint64_t sequence) {
  std::string s = cat(collectiveName(kind), " #", sequence, " (", typeName(type));
  if (reduces(kind)) s += cat(", ", opName(op));
  if (kind == CollectiveKind::Broadcast) s += cat(", root ", root);
  return s + cat(", ", count, " elements)");
}

// ---- the reductions: acc[i] = acc[i] (op) in[i], ranks folded in rank order ----

// Integers wrap (as numpy and NCCL) instead of overflowing, which C++ leaves undefined.
template <class T>
T plus(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

template <class T>
T times(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

// As NCCL's float MAX/MIN (fmaxf/fminf, src/device/reduce_kernel.h): a NaN loses to a number, and only
// NaN against NaN gives NaN. (The engine's CPU backend lets a NaN win instead, as numpy.maximum.)
template <class T>
T larger(T a, T b) {
  if (a != a) return b;
  if (b != b) return a;
  return a < b ? b : a;
}

template <class T>
T smaller(T a, T b) {
  if (a != a) return b;
  if (b != b) return a;
  return b < a ? b : a;
}

template <class T>
void fold(T* acc, const T* in, size_t n, ncclRedOp_t op) {
  switch (op) {
    case ncclSum:
    case ncclAvg:  // (averageParts divides)
      for (size_t i = 0; i < n; ++i) acc[i] = plus(acc[i], in[i]);
      return;
    case ncclProd:
      for (size_t i = 0; i < n; ++i) acc[i] = times(acc[i], in[i]);
      return;
    case ncclMax:
      for (size_t i = 0; i < n; ++i) acc[i] = larger(acc[i], in[i]);
      return;
    case ncclMin:
      for (size_t i = 0; i < n; ++i) acc[i] = smaller(acc[i], in[i]);
      return;
    default:
      return;
  }
}

// AVG as NCCL computes it: for floats, ncclDevPreMulSum, every contribution times 1/nranks (rounded
// to the element type) and then summed; for integers, ncclDevSumPostDiv, the sum divided once.
template <class T>
void averageParts(T* acc, const char* first, size_t stride, int parts, size_t n) {
  if constexpr (std::is_floating_point_v<T>) {
    const T scale = static_cast<T>(1.0 / parts);
    for (int q = 0; q < parts; ++q) {
      const T* in = reinterpret_cast<const T*>(first + q * stride);
      for (size_t i = 0; i < n; ++i) acc[i] = q ? acc[i] + in[i] * scale : in[i] * scale;
    }
  } else {
    std::memcpy(acc, first, n * sizeof(T));
    for (int q = 1; q < parts; ++q) fold(acc, reinterpret_cast<const T*>(first + q * stride), n, ncclSum);
    for (size_t i = 0; i < n; ++i) acc[i] = static_cast<T>(acc[i] / parts);
  }
}

// out = in[0] (op) in[1] (op) ... for `parts` inputs at `first`, `first + stride`, ...
template <class T>
void reduceParts(void* out, const char* first, size_t stride, int parts, size_t n, ncclRedOp_t op) {
  T* acc = static_cast<T*>(out);
  if (op == ncclAvg) return averageParts(acc, first, stride, parts, n);
  std::memcpy(acc, first, n * sizeof(T));
  for (int q = 1; q < parts; ++q) fold(acc, reinterpret_cast<const T*>(first + q * stride), n, op);
}

// float16 and bfloat16 as NCCL reduces them: each operation on two elements is computed in float32
// and rounded back to the type at once, nearest-even (NCCL's __hadd2/__hmul2 or their float32
// emulation: the same bits, as float32 holds at least 2p + 2 bits of either type, so rounding twice
// equals rounding once). Ranks are folded in rank order here, NCCL's ring order differs: with more
// than two ranks the bits may differ from NCCL's, never at two. AVG is ncclDevPreMulSum: every
// contribution times 1/nranks rounded to the type, then summed.
struct Float16Elements {
  static uint16_t narrow(float x) { return cyxwiz::cuda::halfBits(x); }
  static float widen(uint16_t b) { return cyxwiz::cuda::halfValue(b); }
};
struct BFloat16Elements {
  static uint16_t narrow(float x) { return cyxwiz::cuda::bfloat16Bits(x); }
  static float widen(uint16_t b) { return cyxwiz::cuda::bfloat16Value(b); }
};

inline float combine(float a, float b, ncclRedOp_t op) {
  switch (op) {
    case ncclProd: return a * b;
    case ncclMax: return larger(a, b);
    case ncclMin: return smaller(a, b);
    default: return a + b;  // ncclSum, and ncclAvg's sum of premultiplied parts
  }
}

template <class E>
void reduceSixteenBitParts(void* out, const char* first, size_t stride, int parts, size_t n, ncclRedOp_t op) {
  uint16_t* acc = static_cast<uint16_t*>(out);
  auto part = [&](int q) { return reinterpret_cast<const uint16_t*>(first + static_cast<size_t>(q) * stride); };
  if (op == ncclAvg) {
    const float scale = E::widen(E::narrow(static_cast<float>(1.0 / parts)));
    for (int q = 0; q < parts; ++q) {
      for (size_t i = 0; i < n; ++i) {
        const uint16_t mine = E::narrow(E::widen(part(q)[i]) * scale);
        acc[i] = q ? E::narrow(E::widen(acc[i]) + E::widen(mine)) : mine;
      }
    }
    return;
  }
  std::memcpy(acc, first, n * sizeof(uint16_t));
  for (int q = 1; q < parts; ++q) {
    for (size_t i = 0; i < n; ++i) acc[i] = E::narrow(combine(E::widen(acc[i]), E::widen(part(q)[i]), op));
  }
}

void reduceParts(ncclDataType_t type, void* out, const char* first, size_t stride, int parts, size_t n,
                 ncclRedOp_t op) {
  switch (type) {
    case ncclFloat32: reduceParts<float>(out, first, stride, parts, n, op); return;
    case ncclFloat16: reduceSixteenBitParts<Float16Elements>(out, first, stride, parts, n, op); return;
    case ncclBfloat16: reduceSixteenBitParts<BFloat16Elements>(out, first, stride, parts, n, op); return;
    case ncclFloat64: reduceParts<double>(out, first, stride, parts, n, op); return;
    case ncclInt32: reduceParts<int32_t>(out, first, stride, parts, n, op); return;
    case ncclInt64: reduceParts<int64_t>(out, first, stride, parts, n, op); return;
    default: return;
  }
}

// ---- atomics on the shared segment (address-free: GCC's builtins on plain integers) ----

template <class T>
T loadAcquire(const T* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
template <class T>
void storeRelease(T* p, T v) {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

bool readRandom(unsigned char* out, size_t n) {
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd, out + got, n - got);
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      break;
    }
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  return got == n;
}

// Whether process `pid` is gone: no such process, or a zombie (killed, not yet reaped by its parent,
// which a test harness may do only at its end). EPERM and the like: assume it lives.
bool processGone(int32_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", int(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[512];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* paren = std::strrchr(buf, ')');  // "pid (comm) S ...": comm may hold spaces and parentheses
  return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

}  // namespace

size_t elemBytes(ncclDataType_t t) {
  switch (t) {
    case ncclFloat16: return 2;
    case ncclBfloat16: return 2;
    case ncclFloat32: return 4;
    case ncclFloat64: return 8;
    case ncclInt32: return 4;
    case ncclInt64: return 8;
    default: return 0;
  }
}

// The segment: a Header, one RankEntry per rank, then (page-aligned) one slot per rank. A fresh
// segment is zero-filled, which is a valid initial state of everything in it.
struct SharedComm::Header {
  uint64_t magic;     // kMagic once any rank has opened it
  int32_t attached;   // ranks that have joined (atomic)
  int32_t unlinked;   // the name has been removed (atomic: removed once)
};

struct alignas(64) SharedComm::RankEntry {
  uint64_t arrived;  // atomic: 2p+1 once its part of phase p is in its slot, 2p+2 once it has read phase p
  int32_t state;     // atomic: kAbsent, kJoined, kLeft, kAborted
  int32_t pid;
  // Atomic: nonzero once this rank gave up waiting in a collective (it hung or failed there). Its part
  // stays in its slot, so a late peer could still finish that collective while this rank's engine has
  // not aborted, as with NCCL's kernels; once it has aborted or left, the peer fails instead.
  uint64_t abandoned;
  // The collective this rank runs, written before its first arrival in it: every rank compares.
  uint64_t sequence, count;
  int32_t kind, type, op, root;
};

SharedComm::Header* SharedComm::header() const {
  static_assert(sizeof(Header) <= sizeof(RankEntry), "the Header fits in the line before entry 0");
  return reinterpret_cast<Header*>(base_);
}
SharedComm::RankEntry* SharedComm::entry(int rank) const {
  return reinterpret_cast<RankEntry*>(base_ + sizeof(RankEntry)) + rank;  // entry 0 after a Header's line
}
char* SharedComm::slot(int rank) const { return base_ + slotsAt_ + static_cast<size_t>(rank) * slotBytes_; }

const char* collectiveName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::AllReduce: return "ncclAllReduce";
    case CollectiveKind::Broadcast: return "ncclBroadcast";
    case CollectiveKind::AllGather: return "ncclAllGather";
    case CollectiveKind::ReduceScatter: return "ncclReduceScatter";
  }
  return nullptr;
}

std::string makeNcclUniqueId() {
  unsigned char token[kTokenDigits / 2];
  if (!readRandom(token, sizeof token)) {
    // No /dev/urandom: the pid, the clock and a counter still differ between jobs of one machine.
    static std::atomic<uint64_t> counter{0};
    const uint64_t a = uint64_t(getpid()) << 32 ^ counter.fetch_add(1), b = uint64_t(nowNs());
    std::memcpy(token, &a, 8);
    std::memcpy(token + 8, &b, 8);
  }
  std::string id(kUniqueIdTag);
  static const char kHex[] = "0123456789abcdef";
  for (unsigned char c : token) {
    id.push_back(kHex[c >> 4]);
    id.push_back(kHex[c & 15]);
  }
  id.resize(kNcclUniqueIdBytes, '\0');
  return id;
}

bool isNcclUniqueId(const std::string& id) {
  if (id.size() != kNcclUniqueIdBytes || id.compare(0, kTagBytes, kUniqueIdTag) != 0) return false;
  for (size_t i = kTagBytes; i < kTagBytes + kTokenDigits; ++i) {
    const char c = id[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

Status SharedComm::open(const std::string& id, int nranks, int rank, SharedComm** out) {
  *out = nullptr;
  SharedComm* s = new (std::nothrow) SharedComm;
  if (!s) return "out of host memory";
  s->nranks_ = nranks;
  s->rank_ = rank;
  s->timeoutMs_ = timeoutFromEnvironment();
  size_t slot = kSegmentBudget / static_cast<size_t>(nranks) / kPage * kPage;
  slot = slot > kMaxSlotBytes ? kMaxSlotBytes : slot < kMinSlotBytes ? kMinSlotBytes : slot;
  s->slotBytes_ = slot;
  const size_t control = sizeof(RankEntry) * (static_cast<size_t>(nranks) + 1);
  s->slotsAt_ = (control + kPage - 1) / kPage * kPage;
  s->bytes_ = s->slotsAt_ + slot * static_cast<size_t>(nranks);
  // The world size is in the name: ranks that disagree about it never share (and resize) a segment.
  std::snprintf(s->name_, sizeof s->name_, "/cyxwiz-emu-%.*s-%d", int(kTokenDigits), id.c_str() + kTagBytes, nranks);

  // Whoever comes first creates it; ftruncate to the size every rank computes is then a no-op.
  const int fd = shm_open(s->name_, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    Status why = cat("shm_open(\"", s->name_, "\") failed: ", std::strerror(errno));
    delete s;
    return why;
  }
  Status why;
  if (ftruncate(fd, static_cast<off_t>(s->bytes_)) != 0) {
    why = cat("ftruncate of ", s->name_, " to ", s->bytes_, " bytes failed: ", std::strerror(errno));
  } else if (const int e = posix_fallocate(fd, 0, static_cast<off_t>(s->bytes_)); e != 0 && e != EOPNOTSUPP) {
    // Reserved now, so that a full /dev/shm is this error rather than a SIGBUS in a collective.
    why = cat("cannot reserve ", s->bytes_, " bytes of shared memory for ", s->name_, " (/dev/shm full?): ",
              std::strerror(e));
  } else {
    void* p = mmap(nullptr, s->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      why = cat("mmap of ", s->name_, " failed: ", std::strerror(errno));
    } else {
      s->base_ = static_cast<char*>(p);
    }
  }
  ::close(fd);
  if (why.empty()) {
    uint64_t expected = 0;
    if (!__atomic_compare_exchange_n(&s->header()->magic, &expected, kMagic, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE) &&
        expected != kMagic) {
      why = cat(s->name_, " is not a segment of the emulator");
    }
  }
  if (why.empty()) {
    RankEntry* me = s->entry(rank);
    int32_t absent = kAbsent;
    if (!__atomic_compare_exchange_n(&me->state, &absent, int32_t(kJoined), false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
      why = cat("rank ", rank, " joined this communicator twice (two processes with the same RANK?)");
    } else {
      __atomic_store_n(&me->pid, int32_t(getpid()), __ATOMIC_RELEASE);
    }
  }
  if (!why.empty()) {
    if (s->base_) munmap(s->base_, s->bytes_);
    s->base_ = nullptr;
    s->departed_ = true;
    delete s;
    return why;
  }
  // The last rank to join removes the name: from here on only the mappings keep the segment, so that
  // nothing stays in /dev/shm even if every rank is killed.
  if (__atomic_add_fetch(&s->header()->attached, 1, __ATOMIC_ACQ_REL) == nranks) s->unlinkName();
  *out = s;
  return {};
}

SharedComm::~SharedComm() {
  if (base_) munmap(base_, bytes_);
}

void SharedComm::unlinkName() {
  if (__atomic_exchange_n(&header()->unlinked, 1, __ATOMIC_ACQ_REL) == 0) shm_unlink(name_);
}

// Peers waiting for this rank see its state and stop; the name goes too (a rank that joins after this
// one left makes a fresh segment and times out there, as it would wait in vain for this rank anyway).
void SharedComm::depart(int32_t state) {
  if (departed_ || !base_) return;
  departed_ = true;
  storeRelease(&entry(rank_)->state, state);
  unlinkName();
}

void SharedComm::abort() {
  aborted_.store(true);
  depart(kAborted);
}

void SharedComm::leave() {
  aborted_.store(true);  // nothing runs on a destroyed communicator; a waiting run() returns
  depart(kLeft);
}

int SharedComm::joined() const { return base_ ? loadAcquire(&header()->attached) : 0; }

Exchange SharedComm::waitAll(uint64_t target, int64_t deadline, const CollectiveCall& call, std::string* why) {
  auto what = [&] { return describe(call.kind, call.type, call.op, call.root, call.count, sequence_ + 1); };
  int64_t nextPidCheck = nowNs() + 100000000;  // every 100 ms: a peer that died without leaving
  for (int spins = 0;; ++spins) {
    bool all = true;
    for (int q = 0; q < nranks_; ++q) {
      const RankEntry* e = entry(q);
      const int32_t state = loadAcquire(&e->state);
      const bool gone = state == kLeft || state == kAborted;
      if (loadAcquire(&e->arrived) >= target && !(gone && loadAcquire(&e->abandoned))) continue;
      all = false;
      if (gone) {
        *why = cat("emulator: rank ", q, " ",
                   state == kAborted ? "aborted" : "destroyed", " its communicator while rank ", rank_,
                   " waited for it in ", what());
        return Exchange::Failed;
      }
    }
    if (all) return Exchange::Done;
    if (aborted_.load()) return Exchange::Aborted;
    const int64_t now = nowNs();
    if (now >= nextPidCheck) {
      nextPidCheck = now + 100000000;
      for (int q = 0; q < nranks_; ++q) {
        const RankEntry* e = entry(q);
        const int32_t pid = loadAcquire(&e->pid);
        const bool arrived = loadAcquire(&e->arrived) >= target && !loadAcquire(&e->abandoned);
        if (q == rank_ || pid <= 0 || arrived) continue;
        if (processGone(pid)) {
          *why = cat("emulator: rank ", q, ", pid ", pid, ", exited without leaving its communicator while rank ", rank_,
                     " waited for it in ", what());
          return Exchange::Failed;
        }
      }
    }
    if (now >= deadline) {
      std::string missing;
      for (int q = 0; q < nranks_; ++q) {
        if (loadAcquire(&entry(q)->arrived) < target) missing += cat(missing.empty() ? "" : ", ", q);
      }
      *why = cat("rank(s) ", missing, " did not reach ", what(), " within ", timeoutMs_,
                 " ms (DISTRIBUTED_TIMEOUT_MS)");
      return Exchange::Hung;
    }
    // Spin briefly (a peer is usually a few microseconds away), then nap.
    if (spins < 64) {
      sched_yield();
    } else {
      const timespec nap{0, 100000};
      nanosleep(&nap, nullptr);
    }
  }
}

// Nothing moves on this communicator any more (the engine aborts it next).
Exchange SharedComm::giveUp(Exchange e) {
  if (e != Exchange::Aborted) broken_ = true;
  storeRelease(&entry(rank_)->abandoned, uint64_t(1));
  return e;
}

bool SharedComm::sameCollective(const CollectiveCall& call, std::string* why) const {
  const RankEntry* me = entry(rank_);
  bool same = true;
  for (int q = 0; q < nranks_ && same; ++q) {
    const RankEntry* e = entry(q);
    same = e->sequence == me->sequence && e->count == me->count && e->kind == me->kind && e->type == me->type &&
           (!reduces(call.kind) || e->op == me->op) && (call.kind != CollectiveKind::Broadcast || e->root == me->root);
  }
  if (same) return true;
  std::string calls;
  for (int q = 0; q < nranks_; ++q) {
    const RankEntry* e = entry(q);
    calls += cat(q ? "; " : "", "rank ", q, ": ", describe(CollectiveKind(e->kind), ncclDataType_t(e->type), ncclRedOp_t(e->op),
                                                          e->root, e->count, e->sequence));
  }
  *why = cat("emulator: the ranks called different collectives: ", calls,
             "; every rank must call the same collectives in the same order");
  return false;
}

Exchange SharedComm::run(const CollectiveCall& call, std::string* why) {
  if (broken_) return Exchange::Hung;  // behind a collective that never completed
  if (aborted_.load()) return Exchange::Aborted;
  const size_t item = elemBytes(call.type);
  const uint64_t sequence = sequence_ + 1;
  if (call.count == 0) {  // nothing to move: NCCL returns at once, on every rank alike
    sequence_ = sequence;
    return Exchange::Done;
  }
  const size_t n = static_cast<size_t>(nranks_);
  // Elements per phase: one slot holds this rank's part (every block of it for ReduceScatter).
  const size_t per = slotBytes_ / item / (call.kind == CollectiveKind::ReduceScatter ? n : 1);
  const int64_t deadline = nowNs() + timeoutMs_ * 1000000;
  const char* send = static_cast<const char*>(call.send);
  char* recv = static_cast<char*>(call.recv);
  RankEntry* me = entry(rank_);
  for (size_t off = 0; off < call.count; off += per) {
    const size_t len = call.count - off < per ? call.count - off : per;
    const size_t bytes = len * item;
    // Every rank has read the slots of the previous phase before this rank overwrites its own.
    Exchange e = phase_ ? waitAll(2 * phase_, deadline, call, why) : Exchange::Done;
    if (e != Exchange::Done) return giveUp(e);
    char* mine = slot(rank_);
    switch (call.kind) {
      case CollectiveKind::AllReduce:
      case CollectiveKind::AllGather:
        std::memcpy(mine, send + off * item, bytes);
        break;
      case CollectiveKind::Broadcast:
        if (rank_ == call.root) std::memcpy(mine, send + off * item, bytes);
        break;
      case CollectiveKind::ReduceScatter:  // block q of this phase: elements [off, off + len) of q's part
        for (size_t q = 0; q < n; ++q) std::memcpy(mine + q * bytes, send + (q * call.count + off) * item, bytes);
        break;
    }
    if (off == 0) {
      me->sequence = sequence;
      me->count = call.count;
      me->kind = int32_t(call.kind);
      me->type = int32_t(call.type);
      me->op = int32_t(call.op);
      me->root = call.root;
    }
    storeRelease(&me->arrived, 2 * phase_ + 1);
    e = waitAll(2 * phase_ + 1, deadline, call, why);
    if (e != Exchange::Done) return giveUp(e);
    if (off == 0 && !sameCollective(call, why)) {
      // Every rank sees the same mismatch and fails alike. This rank's arrival stands (not abandoned),
      // so that a slower peer, even once this rank has aborted, reports the mismatch too.
      storeRelease(&me->arrived, 2 * phase_ + 2);
      ++phase_;
      broken_ = true;
      mismatch_ = true;
      return Exchange::Failed;
    }
    switch (call.kind) {
      case CollectiveKind::AllReduce:
        reduceParts(call.type, recv + off * item, slot(0), slotBytes_, nranks_, len, call.op);
        break;
      case CollectiveKind::Broadcast:
        std::memcpy(recv + off * item, slot(call.root), bytes);
        break;
      case CollectiveKind::AllGather:
        for (size_t q = 0; q < n; ++q) std::memcpy(recv + (q * call.count + off) * item, slot(int(q)), bytes);
        break;
      case CollectiveKind::ReduceScatter:
        reduceParts(call.type, recv + off * item, slot(0) + rank_ * bytes, slotBytes_, nranks_, len, call.op);
        break;
    }
    storeRelease(&me->arrived, 2 * phase_ + 2);
    ++phase_;
  }
  sequence_ = sequence;
  return Exchange::Done;
}

}  // namespace cxemu::nccl
