#include "csrc/heap_trim.h"

#include <unistd.h>

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

void release_free_heap() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

HeapTrimmer::HeapTrimmer(int64_t bound_bytes, std::function<int64_t()> resident_bytes, std::function<void()> trim)
    : bound_(bound_bytes),
      resident_bytes_(resident_bytes ? std::move(resident_bytes) : std::function<int64_t()>(resident_set_bytes)),
      trim_(trim ? std::move(trim) : std::function<void()>(release_free_heap)) {}

HeapTrimmer HeapTrimmer::from_environment() {
  int64_t mib = -1;  // off unless asked for: the policy's cost is not settled (docs/zero.md)
  if (const char* v = std::getenv("TESSERA_HEAP_TRIM_MIB")) {
    try {
      mib = std::stoll(v);
    } catch (const std::exception&) {
      std::fprintf(stderr, "tessera: warning: TESSERA_HEAP_TRIM_MIB=%s is not an integer; not trimming\n", v);
    }
  }
  return HeapTrimmer(mib < 0 ? -1 : mib << 20);
}

bool HeapTrimmer::after_step() {
  if (bound_ < 0) return false;
  const int64_t rss = resident_bytes_();
  if (rss < 0) return false;
  if (baseline_ < 0 && bound_ > 0) {  // the first step: its working set is the reference
    baseline_ = rss;
    return false;
  }
  if (bound_ > 0 && rss <= baseline_ + bound_) return false;
  trim_();
  ++trims_;
  // A working set that really grew (longer sequences, say) raises the reference, so the trimmer
  // does not then trim every step.
  const int64_t after = resident_bytes_();
  if (after > baseline_) baseline_ = after;
  return true;
}

}  // namespace tessera
