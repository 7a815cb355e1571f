// parallelFor: the engine's own loops (batch norm, pooling) split over the threads cx.set_num_threads
// gives the BLAS, on a small pool of worker threads that sleep between calls. One thread (the ranks of
// a multi-rank job, by default) runs everything on the caller's thread, as before.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>

namespace cyxwiz {

// Calls body(begin, end) over disjoint ranges covering [0, n), each at least `grain` long, on up to
// blas::numThreads() threads (the caller's among them); returns when all are done. `body` must not
// throw and must not call parallelFor itself.
void parallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body);

// Items per task when each item covers `values` values: about 16K values a task, so that waking a
// worker costs little against the work it is given.
inline int64_t grainOf(int64_t values) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(values, 1)); }

// Columns per task of a loop that sums `rows` rows column by column: threads take disjoint columns,
// each summed over the rows in order (the same bits at any thread count); at least 16 (a cache line
// of floats), so that two threads rarely write one line.
inline int64_t columnGrain(int64_t rows) { return std::max<int64_t>(16, grainOf(rows)); }

}  // namespace cyxwiz
