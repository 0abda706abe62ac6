// tessera._C: the process's CPU allocator, CPU features and peak memory (csrc/, engine/progress.h).
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "handles.h"

#include "csrc/cpu_block_cache.h"
#include "csrc/cpu_features.h"
#include "engine/progress.h"

namespace py = pybind11;

namespace tessera {

void bind_runtime(py::module& m) {
  // Large CPU blocks from mappings and a bounded cache from the first import on, so that a model
  // built after `import tessera` leaves no freed heap behind (csrc/cpu_block_cache.h).
  tessera::CpuBlockCache::install_from_environment();
  m.def("cpu_block_cache_stats", [] {
    py::dict d;
    if (const tessera::CpuBlockCache* c = tessera::CpuBlockCache::installed()) {
      const tessera::CpuBlockCacheStats s = c->stats();
      d["capacity_bytes"] = c->capacity_bytes();
      d["hits"] = s.hits;
      d["misses"] = s.misses;
      d["evictions"] = s.evictions;
      d["cached_bytes"] = s.cached_bytes;
      d["mapped_bytes"] = s.mapped_bytes;
      d["peak_in_use_bytes"] = c->peak_in_use_bytes();
    }
    return d;
  }, "The large-block CPU allocator's counters (empty when TESSERA_CPU_BLOCK_CACHE_MIB < 0).");
  m.def("cpu_block_cache_release", [] {
    if (tessera::CpuBlockCache* c = tessera::CpuBlockCache::installed()) c->release_cached();
  }, "Unmaps the large blocks the CPU allocator keeps cached (blocks in use stay).");

  m.def("cpu_has_fast_bf16", &cpu_has_fast_bf16,
        "Whether this CPU has bf16 arithmetic (AVX512_BF16 or AMX-BF16); without it bf16 runs ~11x slower "
        "than fp32 on the CPU. TESSERA_CPU_BF16=0/1 overrides.");
  m.def("peak_rss_bytes", &peak_rss_bytes, "Peak resident set size of this process, in bytes.");
}

}  // namespace tessera
