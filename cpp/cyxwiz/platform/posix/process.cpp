#include "cyxwiz/platform/process.h"

#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>

#include "cyxwiz/common/error.h"

#if defined(__linux__) && !defined(CYXWIZ_PORTABLE_POSIX)
#define CYXWIZ_PROC_FS 1
#endif

namespace cyxwiz::platform {

namespace {

#if defined(CYXWIZ_PROC_FS)
std::string firstLine(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

std::string linkTarget(const char* path) {
  char buf[256];
  ssize_t n = ::readlink(path, buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("?");
}
#endif

// The mount /dev/shm is (device and inode): a container or a simulated host mounts its own.
// Absent on macOS, where shm_open names live in the kernel alone.
std::string shmMount() {
  struct stat st {};
  return ::stat("/dev/shm", &st) == 0 ? makeString(st.st_dev, ":", st.st_ino) : std::string("none");
}

}  // namespace

long currentPid() { return static_cast<long>(::getpid()); }

std::string hostName() {
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = '\0';
  return host;
}

bool processGone(long pid) {
  if (pid <= 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
#if defined(CYXWIZ_PROC_FS)
  // Exited but not yet reaped by its parent: "pid (name) Z ...".
  const std::string line = firstLine(makeString("/proc/", pid, "/stat"));
  size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
#else
  return false;  // a zombie looks alive here: the collective's timeout still bounds the wait
#endif
}

std::string hostIdentity() {
#if defined(CYXWIZ_PROC_FS)
  return makeString("boot ", firstLine("/proc/sys/kernel/random/boot_id"), " ipc ", linkTarget("/proc/self/ns/ipc"),
                    " shm ", shmMount(), " uid ", ::getuid());
#else
  return makeString("host ", hostName(), " id ", ::gethostid(), " shm ", shmMount(), " uid ", ::getuid());
#endif
}

std::string pidNamespace() {
#if defined(CYXWIZ_PROC_FS)
  return linkTarget("/proc/self/ns/pid");
#else
  return "global";
#endif
}

void atFork(void (*prepare)(), void (*parent)(), void (*child)()) { ::pthread_atfork(prepare, parent, child); }

}  // namespace cyxwiz::platform
