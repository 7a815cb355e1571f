// cx.empty_cache() and cx.host_memory_stats(): the host block cache (cyxwiz/tensor/host_cache.h).
#include <pybind11/pybind11.h>

#include "cyxwiz/tensor/host_cache.h"

namespace py = pybind11;

void init_memory(py::module_& m) {
  // Called once by pycyxwiz/__init__.py: a bad CYXWIZ_HOST_CACHE is a ValueError at import, not an
  // exception from whichever thread allocates first.
  m.def("_configure_host_cache", []() { (void)cyxwiz::host_cache::stats(); });
  m.def("empty_cache", &cyxwiz::host_cache::emptyCache,
        "Frees the host memory the block cache keeps for the next tensors of the same sizes.");
  m.def("host_memory_stats", []() {
    const auto s = cyxwiz::host_cache::stats();
    py::dict d;
    d["enabled"] = s.enabled;
    d["min_block_bytes"] = s.minBlockBytes;
    d["live_bytes"] = s.liveBytes;
    d["peak_live_bytes"] = s.peakLiveBytes;
    d["cached_bytes"] = s.cachedBytes;
    d["cached_blocks"] = s.cachedBlocks;
    d["hits"] = s.hits;
    d["misses"] = s.misses;
    d["evictions"] = s.evictions;
    return d;
  }, "The host block cache's counters (blocks of min_block_bytes and more).");
}
