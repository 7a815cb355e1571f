// Processes and the host they run on: ids, liveness, and what makes two ranks "the same host" for
// shared memory.
#pragma once

#include <string>

namespace cyxwiz::platform {

long currentPid();
std::string hostName();  // this machine's name ("?" when the system does not say)
// True only when the process is known to have exited (Linux: a zombie counts as exited). A process
// of another user, or one this system cannot look at, is not gone.
bool processGone(long pid);
// Identifies the shared-memory domain of this process: two ranks with equal identities can map each
// other's shared memory. Linux: boot id, IPC namespace, the /dev/shm mount, uid; macOS and the
// portable build: host name, host id, uid; Windows: computer name, session and user.
std::string hostIdentity();
// The pid namespace (Linux), so that pids published by a peer are comparable; "global" where pids
// are global to the host. One word, no spaces.
std::string pidNamespace();
// Handlers around fork() (pthread_atfork), so that a lock another thread holds at the fork cannot stay
// held forever in the child; nothing where there is no fork (Windows).
void atFork(void (*prepare)(), void (*parent)(), void (*child)());

}  // namespace cyxwiz::platform
