// The shared segment of a host's ranks: platform::SharedMemory (/dev/shm on POSIX, a named file
// mapping on Windows), created by one rank with an unguessable name, attached by name by the others
// and unlinked as soon as they all have, so that nothing outlives the job.
#pragma once

#include "cyxwiz/platform/random.h"
#include "cyxwiz/platform/shared_memory.h"

namespace cyxwiz::comm::shm {

using Segment = platform::SharedMemory;
using platform::randomHex;

}  // namespace cyxwiz::comm::shm
