// The large-block CPU allocator (csrc/cpu_block_cache.h): small requests pass through, a freed
// block serves the next request of about its size, the cache stays within the high-water mark or
// its capacity (also when a request maps a block it cannot serve), evicted blocks leave the
// resident set, and installed as PyTorch's CPU allocator it serves many threads.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

#include <ATen/ops/full.h>
#include <c10/core/CPUAllocator.h>

#include "csrc/cpu_block_cache.h"
#include "csrc/heap_trim.h"

using tessera::resident_set_bytes;

TEST_CASE("block cache: small requests pass through - a freed block serves the next request of about its size") {
  tessera::CpuBlockCache cache(c10::GetDefaultCPUAllocator(), 1 << 20, 8 << 20);
  { c10::DataPtr small = cache.allocate(1000); }
  CHECK(cache.stats().misses == 0);
  void* first = nullptr;
  {
    c10::DataPtr a = cache.allocate(3 << 20);
    first = a.get();
    std::memset(a.get(), 7, 3 << 20);
    CHECK(cache.stats().mapped_bytes == 3 << 20);
  }
  CHECK(cache.stats().cached_bytes == 3 << 20);
  {
    c10::DataPtr b = cache.allocate((3 << 20) - 100000);  // within 1/8: reused
    CHECK(b.get() == first);
    CHECK(static_cast<unsigned char*>(b.get())[0] == 7);
    c10::DataPtr c = cache.allocate(2 << 20);  // more than 1/8 smaller than anything cached: mapped
    CHECK(c.get() != first);
  }
  const tessera::CpuBlockCacheStats s = cache.stats();
  CHECK(s.hits == 1);
  CHECK(s.misses == 2);
  CHECK(s.mapped_bytes == 0);
  CHECK(s.cached_bytes == 5 << 20);
  // The raw API (ATen's scratch buffers) frees either size class.
  REQUIRE(cache.raw_deleter() != nullptr);
  void* raw_large = cache.raw_allocate(3 << 20);
  void* raw_small = cache.raw_allocate(100);
  CHECK(cache.stats().hits == 2);
  cache.raw_deallocate(raw_small);
  cache.raw_deallocate(raw_large);
  CHECK(cache.stats().mapped_bytes == 0);
}

TEST_CASE("block cache: it keeps the room below the high-water mark or its capacity - oldest blocks unmapped first") {
  tessera::CpuBlockCache cache(c10::GetDefaultCPUAllocator(), 1 << 20, 8 << 20);
  std::vector<c10::DataPtr> blocks;
  for (int i = 0; i < 5; ++i) blocks.push_back(cache.allocate(2 << 20));
  CHECK(cache.peak_in_use_bytes() == 10 << 20);
  blocks.clear();  // 10 MiB freed below a 10 MiB mark: all kept for the next "step", past the capacity
  tessera::CpuBlockCacheStats s = cache.stats();
  CHECK(s.cached_bytes == 10 << 20);
  CHECK(s.evictions == 0);
  {
    c10::DataPtr again = cache.allocate(2 << 20);
    CHECK(cache.stats().hits == 1);
    cache.release_cached();  // unmaps the cache; the mark restarts from the 2 MiB in use
    CHECK(cache.stats().cached_bytes == 0);
    CHECK(cache.peak_in_use_bytes() == 2 << 20);
  }
  // One block at a time: the mark stays low, so the capacity (8 MiB) bounds the cache.
  const int64_t released = cache.stats().evictions;  // release_cached() counts its unmaps too
  { c10::DataPtr b = cache.allocate(3 << 20); }  // cached: 2 + 3
  { c10::DataPtr b = cache.allocate(5 << 20); }  // 2 + 3 + 5 > 8: the oldest (2) goes
  s = cache.stats();
  CHECK(s.cached_bytes == 8 << 20);
  CHECK(s.evictions - released == 1);
  { c10::DataPtr b = cache.allocate(16 << 20); }  // raises the mark to 16: kept, the others go
  s = cache.stats();
  CHECK(s.cached_bytes == 16 << 20);
  CHECK(s.evictions - released == 3);
  cache.release_cached();
  CHECK(cache.stats().cached_bytes == 0);

  // Capacity 0 caches nothing, not even below the mark.
  tessera::CpuBlockCache none(c10::GetDefaultCPUAllocator(), 1 << 20, 0);
  for (int i = 0; i < 3; ++i) blocks.push_back(none.allocate(2 << 20));
  blocks.clear();
  CHECK(none.stats().cached_bytes == 0);
}

TEST_CASE("block cache: a request it cannot serve shrinks it first - in use + cached stays within the mark or in use + capacity") {
  tessera::CpuBlockCache cache(c10::GetDefaultCPUAllocator(), 1 << 20, 4 << 20);
  std::vector<c10::DataPtr> small;
  for (int i = 0; i < 8; ++i) small.push_back(cache.allocate(2 << 20));  // the mark: 16 MiB
  small.clear();  // all 16 MiB cached below the mark
  CHECK(cache.stats().cached_bytes == 16 << 20);
  // 12 MiB fits no cached block: mapping it beside them would hold 28 MiB at a 16 MiB mark.
  c10::DataPtr big = cache.allocate(12 << 20);
  tessera::CpuBlockCacheStats s = cache.stats();
  CHECK(s.mapped_bytes == 12 << 20);
  CHECK(s.cached_bytes == 4 << 20);  // the room below the mark (or the capacity: both 4 MiB)
  CHECK(s.mapped_bytes + s.cached_bytes <= std::max<int64_t>(cache.peak_in_use_bytes(), s.mapped_bytes + (4 << 20)));
  c10::DataPtr bigger = cache.allocate(20 << 20);  // past the mark: the capacity bounds the cache
  s = cache.stats();
  CHECK(s.cached_bytes == 4 << 20);
  CHECK(s.mapped_bytes + s.cached_bytes == (32 << 20) + (4 << 20));
}

TEST_CASE("block cache: an evicted block leaves the resident set - a cached one stays") {
  tessera::CpuBlockCache cache(c10::GetDefaultCPUAllocator(), 1 << 20, 64 << 20);
  const int64_t base = resident_set_bytes();
  {
    c10::DataPtr a = cache.allocate(48 << 20);
    std::memset(a.get(), 1, 48 << 20);
    CHECK(resident_set_bytes() > base + (40 << 20));
  }
  CHECK(resident_set_bytes() > base + (40 << 20));  // cached
  cache.release_cached();
  CHECK(resident_set_bytes() < base + (8 << 20));
}

TEST_CASE("block cache: installed as PyTorch's CPU allocator - tensors from many threads") {
  tessera::CpuBlockCache* cache = tessera::CpuBlockCache::install_from_environment();
  REQUIRE(cache != nullptr);
  CHECK(tessera::CpuBlockCache::install_from_environment() == cache);
  CHECK(c10::GetCPUAllocator() == cache);
  const int64_t misses = cache->stats().misses, hits = cache->stats().hits;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([] {
      for (int i = 0; i < 50; ++i) {
        at::Tensor x = at::full({1 << 18}, float(i));  // 1 MiB
        if (x[7].item<float>() != float(i)) throw std::runtime_error("wrong value");
      }
    });
  for (std::thread& t : threads) t.join();
  const tessera::CpuBlockCacheStats s = cache->stats();
  CHECK(s.misses + s.hits - misses - hits == 200);
  CHECK(s.hits - hits >= 150);  // after the first round each thread reuses a cached block
}
