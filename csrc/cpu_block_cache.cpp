#include "csrc/cpu_block_cache.h"

#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>

namespace tessera {

namespace {

// One lock and one registry for every cache: a deleter receives only the data pointer, and the
// raw API (raw_deallocate) may hand back pointers of either size class.
std::mutex& registry_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
// Large blocks in use: address -> (owner, length), under registry_mutex().
std::unordered_map<void*, std::pair<CpuBlockCache*, size_t>>& in_use() {
  static auto* m = new std::unordered_map<void*, std::pair<CpuBlockCache*, size_t>>;
  return *m;
}
// The small allocator's raw deleter, for raw_deallocate of a pointer that is not a large block.
c10::DeleterFnPtr g_small_raw_deleter = nullptr;

void free_unregistered(void* data) {
  // Only raw_deallocate can get here (a large block's DataPtr always finds itself registered).
  TORCH_CHECK(g_small_raw_deleter, "tessera: CpuBlockCache cannot free ", data, ": not one of its blocks");
  g_small_raw_deleter(data);
}

size_t page_rounded(size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

}  // namespace

CpuBlockCache::CpuBlockCache(c10::Allocator* small, int64_t threshold_bytes, int64_t capacity_bytes)
    : small_(small),
      threshold_(static_cast<size_t>(std::max<int64_t>(threshold_bytes, 1))),
      capacity_(std::max<int64_t>(capacity_bytes, 0)) {
  if (c10::DeleterFnPtr d = small_->raw_deleter()) g_small_raw_deleter = d;
}

CpuBlockCache::~CpuBlockCache() {
  release_cached();
  // Blocks still in use outlive their cache: they are unmapped when freed, by free_large.
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (auto& [base, entry] : in_use())
    if (entry.first == this) entry.first = nullptr;
}

c10::DeleterFnPtr CpuBlockCache::raw_deleter() const {
  return small_->raw_deleter() ? &CpuBlockCache::free_large : nullptr;
}

c10::DataPtr CpuBlockCache::allocate(size_t bytes) {
  if (bytes < threshold_) return small_->allocate(bytes);
  const size_t length = page_rounded(bytes);
  void* base = nullptr;
  size_t mapped = length;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    // The smallest cached block that fits, if it wastes at most 1/8 of itself.
    auto it = by_size_.lower_bound(length);
    if (it != by_size_.end() && it->first - length <= it->first / 8) {
      base = it->second;
      mapped = it->first;
      by_size_.erase(it);
      by_age_.erase(cached_.at(base).age);
      cached_.erase(base);
      stats_.cached_bytes -= static_cast<int64_t>(mapped);
      ++stats_.hits;
      stats_.mapped_bytes += static_cast<int64_t>(mapped);
      peak_in_use_ = std::max(peak_in_use_, stats_.mapped_bytes);
      in_use()[base] = {this, mapped};
    } else {
      ++stats_.misses;
      // The new block counts as in use before it is mapped: the cache shrinks first, so the
      // resident set stays within the larger of the mark and (in use + capacity). Blocks too small
      // to serve a request (a model's freed 4 MiB weights, then a 64 MiB flat buffer) otherwise
      // sat mapped beside it.
      trim_cache_to(cache_limit(stats_.mapped_bytes + static_cast<int64_t>(length)));
    }
  }
  if (!base) {
    base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
      // Out of memory or address space: give the cache back and try once more.
      release_cached();
      base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      TORCH_CHECK(base != MAP_FAILED, "tessera: cannot map ", length, " bytes of CPU memory");
    }
    std::lock_guard<std::mutex> lock(registry_mutex());
    stats_.mapped_bytes += static_cast<int64_t>(length);
    peak_in_use_ = std::max(peak_in_use_, stats_.mapped_bytes);
    in_use()[base] = {this, length};
  }
  return c10::DataPtr(base, base, &CpuBlockCache::free_large, c10::Device(c10::DeviceType::CPU));
}

void CpuBlockCache::free_large(void* data) {
  std::unique_lock<std::mutex> lock(registry_mutex());
  auto it = in_use().find(data);
  if (it == in_use().end()) {
    lock.unlock();
    free_unregistered(data);
    return;
  }
  auto [owner, bytes] = it->second;
  in_use().erase(it);
  if (!owner) {  // its cache is gone
    munmap(data, bytes);
    return;
  }
  owner->give_back(data, Block{owner, bytes});
}

void CpuBlockCache::give_back(void* base, Block block) {
  stats_.mapped_bytes -= static_cast<int64_t>(block.bytes);
  const int64_t limit = cache_limit(stats_.mapped_bytes);
  if (static_cast<int64_t>(block.bytes) > limit) {
    munmap(base, block.bytes);
    return;
  }
  trim_cache_to(limit - static_cast<int64_t>(block.bytes));
  block.age = ++clock_;
  by_size_.emplace(block.bytes, base);
  by_age_.emplace(block.age, base);
  cached_.emplace(base, block);
  stats_.cached_bytes += static_cast<int64_t>(block.bytes);
}

// What may stay mapped unused while `in_use` bytes are: the capacity, or the room below the mark.
int64_t CpuBlockCache::cache_limit(int64_t in_use) const {
  return capacity_ == 0 ? 0 : std::max(capacity_, peak_in_use_ - in_use);
}

void CpuBlockCache::trim_cache_to(int64_t bytes) {
  while (stats_.cached_bytes > bytes && !by_age_.empty()) evict_oldest();
}

void CpuBlockCache::evict_oldest() {
  void* base = by_age_.begin()->second;
  by_age_.erase(by_age_.begin());
  const size_t bytes = cached_.at(base).bytes;
  cached_.erase(base);
  auto [first, last] = by_size_.equal_range(bytes);
  for (auto it = first; it != last; ++it)
    if (it->second == base) {
      by_size_.erase(it);
      break;
    }
  stats_.cached_bytes -= static_cast<int64_t>(bytes);
  ++stats_.evictions;
  munmap(base, bytes);
}

CpuBlockCacheStats CpuBlockCache::stats() const {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return stats_;
}

void CpuBlockCache::release_cached() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  while (!by_age_.empty()) evict_oldest();
  peak_in_use_ = stats_.mapped_bytes;
}

int64_t CpuBlockCache::peak_in_use_bytes() const {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return peak_in_use_;
}

namespace {
std::atomic<CpuBlockCache*> g_installed{nullptr};

int64_t integer_from_environment(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr) return fallback;
  try {
    return std::stoll(v);
  } catch (const std::exception&) {
    std::fprintf(stderr, "tessera: warning: %s=%s is not an integer; using %lld\n", name, v,
                 static_cast<long long>(fallback));
    return fallback;
  }
}
}  // namespace

CpuBlockCache* CpuBlockCache::installed() { return g_installed.load(); }

CpuBlockCache* CpuBlockCache::install_from_environment() {
  static CpuBlockCache* installed = []() -> CpuBlockCache* {
    const int64_t mib = integer_from_environment("TESSERA_CPU_BLOCK_CACHE_MIB", kDefaultCapacityMiB);
    if (mib < 0) return nullptr;
    const int64_t threshold_kib =
        std::max<int64_t>(integer_from_environment("TESSERA_CPU_BLOCK_THRESHOLD_KIB", kDefaultThresholdBytes >> 10), 4);
    auto* cache = new CpuBlockCache(c10::GetCPUAllocator(), threshold_kib << 10, mib << 20);
    c10::SetCPUAllocator(cache, /*priority=*/1);
    g_installed.store(cache);
    return cache;
  }();
  return installed;
}

}  // namespace tessera
