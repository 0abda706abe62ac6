#include "csrc/heap_trim.h"

#include "csrc/cpu_block_cache.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace tessera {

int64_t resident_set_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return -1;
  long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE)) : -1;
}

void trim_glibc_heap() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

void release_free_heap() {
  // The large-block cache too: what it keeps was freed, and its high-water mark restarts here.
  if (CpuBlockCache* cache = CpuBlockCache::installed()) cache->release_cached();
  trim_glibc_heap();
}

HeapTrimmer::HeapTrimmer(int64_t bound_bytes, int warmup_steps, std::function<int64_t()> resident_bytes,
                         std::function<void()> trim)
    : bound_(bound_bytes),
      resident_bytes_(resident_bytes ? std::move(resident_bytes) : std::function<int64_t()>(resident_set_bytes)),
      trim_(trim ? std::move(trim) : std::function<void()>(trim_glibc_heap)),
      warmup_steps_(bound_bytes > 0 ? std::max(warmup_steps, 1) : 0) {}

HeapTrimmer HeapTrimmer::from_environment() {
  int64_t mib = kDefaultBoundMiB;
  if (const char* v = std::getenv("TESSERA_HEAP_TRIM_MIB")) {
    try {
      mib = std::stoll(v);
    } catch (const std::exception&) {
      std::fprintf(stderr, "tessera: warning: TESSERA_HEAP_TRIM_MIB=%s is not an integer; using %lld\n", v,
                   static_cast<long long>(mib));
    }
  }
  return HeapTrimmer(mib < 0 ? -1 : mib << 20);
}

bool HeapTrimmer::after_step() {
  if (bound_ < 0) return false;
  if (bound_ == 0) {  // every step
    trim_();
    ++trims_;
    return true;
  }
  if (steps_ == 0) {
    // After the first step: what construction freed (the model's own tensors, ZeRO-3's whole
    // buffers) goes back before the working set is measured.
    ++steps_;
    trim_();
    ++trims_;
    return true;
  }
  const int64_t rss = resident_bytes_();
  if (rss < 0) return false;
  if (steps_++ <= warmup_steps_) {  // still measuring the working set
    baseline_ = std::max(baseline_, rss);
    return false;
  }
  if (rss <= baseline_ + bound_) return false;
  trim_();
  ++trims_;
  // A working set that really grew (longer sequences, say) raises the reference, so the trimmer
  // does not then trim every step.
  const int64_t after = resident_bytes_();
  if (after > baseline_) baseline_ = after;
  return true;
}

}  // namespace tessera
