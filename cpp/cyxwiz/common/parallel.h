// parallelFor: the engine's own loops (batch norm, pooling) split over the threads cx.set_num_threads
// gives the BLAS, on a small pool of worker threads that sleep between calls. One thread (the ranks of
// a multi-rank job, by default) runs everything on the caller's thread, as before.
#pragma once

#include <cstdint>
#include <functional>

namespace cyxwiz {

// Calls body(begin, end) over disjoint ranges covering [0, n), each at least `grain` long, on up to
// blas::numThreads() threads (the caller's among them); returns when all are done. `body` must not
// throw and must not call parallelFor itself.
void parallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body);

}  // namespace cyxwiz
