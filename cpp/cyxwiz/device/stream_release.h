// Releasing memory another library owns, in the order of our compute stream. Memory imported
// through DLPack or __cuda_array_interface__ belongs to its producer (a CuPy or PyTorch caching
// allocator), which reuses it the moment we drop our reference, on its own stream. Our kernels that
// read it may still be queued, so the reference is dropped only once the compute stream has passed
// them: an event is recorded at release time, and the owner is let go when it completes.
#pragma once

#include <memory>

namespace cyxwiz::device {

// Wraps `owner` (the producer's reference) so that dropping the wrapper releases `owner` once
// cuda:`dev`'s compute stream has finished the work queued before the drop.
std::shared_ptr<void> releasedAfterCompute(int dev, std::shared_ptr<void> owner);

// Lets go of the owners whose events completed (`wait`: all of them, after the device work
// finishes). Called at every release and allocation; cheap when nothing is pending.
void drainStreamReleases(bool wait = false) noexcept;

}  // namespace cyxwiz::device
