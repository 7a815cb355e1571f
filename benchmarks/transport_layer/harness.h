// What ours.cpp and uv.cpp share: the two processes, their control pipes, the data pattern and its
// checks, the timing and the report. Each program supplies an Endpoint (how it connects and how it
// moves one exchange); everything else is identical, so the two differ only in the byte-moving layer.
//
// Two processes (fork): rank 0 listens on 127.0.0.1, rank 1 connects. One exchange = each rank sends
// `bytes` to the other while receiving `bytes` from it (one ring step at 2 ranks). With --links 2 (the
// default, as pycyxwiz's ring does at 2 ranks: "each socket carries one direction") there are two TCP
// connections, one per direction; with --links 1 one connection carries both directions.
#pragma once

#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace bench {

using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<size_t> sizes{size_t{4} << 10, size_t{256} << 10, size_t{4} << 20, size_t{64} << 20};
  long reps = 0;       // timed exchanges per size; 0: clamp(2 GiB / bytes, 20, 20000)
  long warmup = -1;    // untimed exchanges before them; -1: max(2, reps / 10)
  int links = 2;       // 2: one connection per direction (the ring at 2 ranks); 1: one full-duplex connection
  long spinUs = 0;     // retry without sleeping this long before blocking in poll/epoll (0: block at once)
  bool checkAll = false;  // verify every byte of every exchange (slow: for correctness runs, not timing)
  int timeoutS = 60;     // any single wait without progress (accept, connect, an exchange, the control pipe)
  int watchdogS = 1200;  // the whole run of each process (alarm); run.sh adds `timeout` around that
  std::string inject;  // self-test of the checks: corrupt (rank 0 flips a received bit), stall, exit (rank 1)
};

[[noreturn]] inline void fail(const std::string& what) { throw std::runtime_error(what); }

inline std::string errnoText(const char* what, int err) { return std::string(what) + ": " + std::strerror(err); }

inline size_t parseSize(const std::string& s) {
  char* end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  std::string unit = end;
  if (unit == "K" || unit == "KiB") v <<= 10;
  else if (unit == "M" || unit == "MiB") v <<= 20;
  else if (unit == "G" || unit == "GiB") v <<= 30;
  else if (!unit.empty()) fail("bad size '" + s + "' (e.g. 4096, 4K, 256K, 4M, 64M)");
  if (v < 16 || v % 8 != 0) fail("size '" + s + "' must be a multiple of 8 bytes, at least 16");
  return static_cast<size_t>(v);
}

inline std::string sizeName(size_t b) {
  char buf[32];
  if (b % (size_t{1} << 20) == 0) std::snprintf(buf, sizeof buf, "%zuMiB", b >> 20);
  else if (b % 1024 == 0) std::snprintf(buf, sizeof buf, "%zuKiB", b >> 10);
  else std::snprintf(buf, sizeof buf, "%zuB", b);
  return buf;
}

inline Options parseOptions(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) fail("option " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--sizes") {
      o.sizes.clear();
      std::string list = value();
      size_t start = 0;
      while (start <= list.size()) {
        size_t comma = list.find(',', start);
        if (comma == std::string::npos) comma = list.size();
        if (comma > start) o.sizes.push_back(parseSize(list.substr(start, comma - start)));
        start = comma + 1;
      }
      if (o.sizes.empty()) fail("--sizes: empty list");
    } else if (a == "--reps") {
      o.reps = std::atol(value().c_str());
      if (o.reps < 1) fail("--reps must be >= 1");
    } else if (a == "--warmup") {
      o.warmup = std::atol(value().c_str());
      if (o.warmup < 1) fail("--warmup must be >= 1 (the first warm-up exchange is fully verified)");
    } else if (a == "--links") {
      o.links = std::atoi(value().c_str());
      if (o.links != 1 && o.links != 2) fail("--links must be 1 or 2");
    } else if (a == "--spin-us") {
      o.spinUs = std::atol(value().c_str());
      if (o.spinUs < 0) fail("--spin-us must be >= 0");
    } else if (a == "--check-all") {
      o.checkAll = true;
    } else if (a == "--timeout-s") {
      o.timeoutS = std::atoi(value().c_str());
      if (o.timeoutS < 1) fail("--timeout-s must be >= 1");
    } else if (a == "--watchdog-s") {
      o.watchdogS = std::atoi(value().c_str());
      if (o.watchdogS < 1) fail("--watchdog-s must be >= 1");
    } else if (a == "--inject") {
      o.inject = value();
      if (o.inject != "corrupt" && o.inject != "stall" && o.inject != "exit") fail("--inject: corrupt, stall or exit");
    } else if (a == "-h" || a == "--help") {
      std::printf(
          "usage: %s [--sizes 4K,256K,4M,64M] [--reps N] [--warmup N] [--links 1|2] [--spin-us N]\n"
          "          [--check-all] [--timeout-s N] [--watchdog-s N]\n          [--inject corrupt|stall|exit]\n",
          argv[0]);
      std::exit(0);
    } else {
      fail("unknown option " + a + " (--help)");
    }
  }
  return o;
}

inline long repsFor(const Options& o, size_t bytes) {
  if (o.reps > 0) return o.reps;
  long r = static_cast<long>((size_t{1} << 31) / bytes);
  return std::clamp(r, 20L, 20000L);
}

inline long warmupFor(const Options& o, long reps) { return o.warmup >= 0 ? o.warmup : std::max(2L, reps / 10); }

// ---- data pattern: 64-bit words depending on (sender, size, index); the first and last words carry a
// stamp of (sender, exchange number), so each exchange's head and tail differ from the previous one's.

inline uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline uint64_t patternWord(int sender, size_t bytes, size_t j) {
  return mix((uint64_t(sender + 1) << 56) ^ (uint64_t(bytes) << 20) ^ j);
}
inline uint64_t stampHead(int sender, uint64_t n) { return 0x5EAD000000000000ull ^ (uint64_t(sender) << 44) ^ n; }
inline uint64_t stampTail(int sender, uint64_t n) { return ~stampHead(sender, n) ^ 0x7A11ull; }

inline void fillPattern(uint64_t* w, size_t bytes, int sender) {
  for (size_t j = 0; j < bytes / 8; ++j) w[j] = patternWord(sender, bytes, j);
}
inline void stamp(uint64_t* w, size_t bytes, int sender, uint64_t n) {
  w[0] = stampHead(sender, n);
  w[bytes / 8 - 1] = stampTail(sender, n);
}
inline void checkStamps(const uint64_t* w, size_t bytes, int sender, uint64_t n) {
  if (w[0] != stampHead(sender, n) || w[bytes / 8 - 1] != stampTail(sender, n)) {
    char msg[200];
    std::snprintf(msg, sizeof msg, "exchange %" PRIu64 " of %zu bytes: head/tail stamp from rank %d wrong", n, bytes,
                  sender);
    fail(msg);
  }
}
inline void checkAllWords(const uint64_t* w, size_t bytes, int sender, uint64_t n) {
  checkStamps(w, bytes, sender, n);
  for (size_t j = 1; j + 1 < bytes / 8; ++j) {
    if (w[j] != patternWord(sender, bytes, j)) {
      char msg[200];
      std::snprintf(msg, sizeof msg, "exchange %" PRIu64 " of %zu bytes: byte %zu from rank %d wrong", n, bytes, j * 8,
                    sender);
      fail(msg);
    }
  }
}

// ---- control pipes between the two processes (not timed)

inline void waitReadable(int fd, int timeoutMs, const char* what) {
  pollfd p{fd, POLLIN, 0};
  for (;;) {
    int rc = ::poll(&p, 1, timeoutMs);
    if (rc > 0) return;
    if (rc == 0) fail(std::string(what) + ": timed out");
    if (errno != EINTR) fail(errnoText(what, errno));
  }
}

inline void writeAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = ::write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) fail(errnoText("control pipe write", errno));
    p += k;
    n -= static_cast<size_t>(k);
  }
}

inline void readAll(int fd, void* data, size_t n, int timeoutMs) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    waitReadable(fd, timeoutMs, "control pipe (the other process)");
    ssize_t k = ::read(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0) fail("control pipe: the other process exited");
    if (k < 0) fail(errnoText("control pipe read", errno));
    p += k;
    n -= static_cast<size_t>(k);
  }
}

// ---- what each program supplies

class Endpoint {
 public:
  virtual ~Endpoint() = default;
  // Rank 0: listen on 127.0.0.1, an ephemeral port; returns it.
  virtual int listenLoopback() = 0;
  // Rank 0: accept n connections; returns each one's peer port, in the order of the links.
  virtual std::vector<int> acceptLinks(int n, int timeoutMs) = 0;
  // Rank 1: n connections to 127.0.0.1:port, one after the other; returns each one's local port.
  virtual std::vector<int> connectLinks(int port, int n, int timeoutMs) = 0;
  // Which link (index into the lists above) this rank sends on and receives from.
  virtual void useLinks(int sendLink, int recvLink) = 0;
  // One exchange: send `bytes` from `send` while receiving `bytes` into `recv`; throws on failure.
  virtual void exchange(const char* send, char* recv, size_t bytes) = 0;
  virtual std::string describe() const = 0;
};

inline double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  double pos = q * (v.size() - 1);
  size_t lo = static_cast<size_t>(pos);
  size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

inline volatile pid_t childPid = 0;  // rank 0: rank 1's pid, for the watchdog to kill and reap

// The watchdog (SIGALRM), or `timeout`/Ctrl-C (SIGTERM, SIGINT): take rank 1 down too, and reap it.
extern "C" inline void onAlarm(int sig) {
  const char alarmMsg[] = "transport_layer: watchdog (--watchdog-s) expired\n";
  const char termMsg[] = "transport_layer: terminated\n";
  ssize_t ignored = sig == SIGALRM ? ::write(2, alarmMsg, sizeof alarmMsg - 1) : ::write(2, termMsg, sizeof termMsg - 1);
  (void)ignored;
  if (childPid > 0) {
    ::kill(childPid, SIGKILL);
    int status;
    ::waitpid(childPid, &status, 0);
  }
  ::_exit(124);
}

// One rank's whole run; rank 0 also gathers rank 1's timings (up pipe) and prints the report.
inline void runRank(int rank, Endpoint& ep, const Options& o, int upFd, int downFd, const char* impl) {
  const int timeoutMs = o.timeoutS * 1000;
  const int peer = 1 - rank;
  // Connect. Rank 1 dials `links` connections and tells rank 0 its local ports; rank 0 matches them to
  // the accepted ones. Link 0 carries rank 1 -> rank 0, link 1 rank 0 -> rank 1 (with --links 1 both
  // directions go through link 0).
  if (rank == 0) {
    int port = ep.listenLoopback();
    writeAll(downFd, &port, sizeof port);
    std::vector<int> accepted = ep.acceptLinks(o.links, timeoutMs);
    std::vector<int> dialed(o.links);
    readAll(upFd, dialed.data(), sizeof(int) * dialed.size(), timeoutMs);
    auto indexOf = [&](int link) {
      auto it = std::find(accepted.begin(), accepted.end(), dialed[link]);
      if (it == accepted.end()) fail("an accepted connection does not come from rank 1");
      return static_cast<int>(it - accepted.begin());
    };
    ep.useLinks(indexOf(o.links - 1), indexOf(0));
  } else {
    int port = 0;
    readAll(downFd, &port, sizeof port, timeoutMs);
    std::vector<int> local = ep.connectLinks(port, o.links, timeoutMs);
    writeAll(upFd, local.data(), sizeof(int) * local.size());
    ep.useLinks(0, o.links - 1);
  }
  if (rank == 0) {
    std::printf("# %s: %s; links=%d spin_us=%ld%s\n", impl, ep.describe().c_str(), o.links, o.spinUs,
                o.checkAll ? " check-all" : "");
    std::fflush(stdout);
  }

  for (size_t bytes : o.sizes) {
    const long reps = repsFor(o, bytes), warm = warmupFor(o, reps);
    const size_t words = bytes / 8;
    std::vector<uint64_t> sendBuf(words), recvBuf(words);
    fillPattern(sendBuf.data(), bytes, rank);
    std::memset(recvBuf.data(), 0xA5, bytes);  // also faults the pages in before timing
    std::vector<int64_t> ns(static_cast<size_t>(reps));
    long fullChecks = 0, stampChecks = 0;
    for (long i = 0; i < warm + reps; ++i) {
      const uint64_t n = static_cast<uint64_t>(i);
      const bool full = o.checkAll || i == 0 || i == warm + reps - 1;
      stamp(sendBuf.data(), bytes, rank, n);
      if (full) std::memset(recvBuf.data(), 0xA5, bytes);  // stale data must not pass the check
      if (rank == 1 && i == 1 && bytes == o.sizes.back()) {  // self-tests: rank 1 stops answering, or dies
        if (o.inject == "stall") ::pause();
        if (o.inject == "exit") ::_exit(3);
      }
      auto start = Clock::now();
      ep.exchange(reinterpret_cast<const char*>(sendBuf.data()), reinterpret_cast<char*>(recvBuf.data()), bytes);
      auto end = Clock::now();
      if (i >= warm) ns[static_cast<size_t>(i - warm)] = std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count();
      if (rank == 0 && i == 0 && o.inject == "corrupt") recvBuf[words / 2] ^= 1u << 13;
      if (full) {
        checkAllWords(recvBuf.data(), bytes, peer, n);
        ++fullChecks;
      } else {
        checkStamps(recvBuf.data(), bytes, peer, n);
      }
      ++stampChecks;
    }
    if (rank == 1) {
      writeAll(upFd, ns.data(), sizeof(int64_t) * ns.size());
      continue;
    }
    std::vector<int64_t> other(ns.size());
    readAll(upFd, other.data(), sizeof(int64_t) * other.size(), timeoutMs);
    // An exchange is over when both ranks have finished it: the slower rank's time counts.
    std::vector<double> us(ns.size());
    for (size_t k = 0; k < ns.size(); ++k) us[k] = static_cast<double>(std::max(ns[k], other[k])) / 1e3;
    const double med = percentile(us, 0.5);
    double sum = 0;
    for (double u : us) sum += u;
    std::printf(
        "RESULT impl=%s links=%d spin_us=%ld bytes=%zu size=%s reps=%ld warmup=%ld median_us=%.3f p10_us=%.3f "
        "p90_us=%.3f mean_us=%.3f gbps=%.4f full_checks=%ld stamp_checks=%ld ok=1\n",
        impl, o.links, o.spinUs, bytes, sizeName(bytes).c_str(), reps, warm, med, percentile(us, 0.1),
        percentile(us, 0.9), sum / static_cast<double>(us.size()), static_cast<double>(bytes) / (med * 1e3),
        fullChecks, stampChecks);
    std::fflush(stdout);
  }
}

// fork, run both ranks, clean up. Returns the exit status for main().
inline int runBenchmark(int argc, char** argv, const char* impl, Endpoint* (*makeEndpoint)(const Options&)) {
  Options o;
  try {
    o = parseOptions(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", impl, e.what());
    return 2;
  }
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGALRM, onAlarm);
  ::signal(SIGTERM, onAlarm);
  ::signal(SIGINT, onAlarm);
  ::alarm(static_cast<unsigned>(o.watchdogS));
  int up[2], down[2];
  if (::pipe(up) != 0 || ::pipe(down) != 0) {
    std::perror("pipe");
    return 1;
  }
  std::fflush(stdout);
  const pid_t parentPid = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) {
    std::perror("fork");
    return 1;
  }
  if (child == 0) {
    // Rank 1. Dies with rank 0 (whatever kills it), never outlives the watchdog.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parentPid) ::_exit(1);
    ::close(up[0]);
    ::close(down[1]);
    ::alarm(static_cast<unsigned>(o.watchdogS));
    try {
      Endpoint* ep = makeEndpoint(o);
      runRank(1, *ep, o, up[1], down[0], impl);
      delete ep;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s rank 1: %s\n", impl, e.what());
      std::fflush(stderr);
      ::_exit(1);
    }
    std::fflush(stdout);
    ::_exit(0);
  }
  childPid = child;
  ::close(up[1]);
  ::close(down[0]);
  int rc = 0;
  try {
    Endpoint* ep = makeEndpoint(o);
    runRank(0, *ep, o, up[0], down[1], impl);
    delete ep;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s rank 0: %s\n", impl, e.what());
    rc = 1;
  }
  if (rc != 0) ::kill(child, SIGKILL);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    if (rc == 0) {
      std::fprintf(stderr, "%s: rank 1 failed (status 0x%x)\n", impl, status);
    }
    rc = 1;
  }
  return rc;
}

}  // namespace bench
