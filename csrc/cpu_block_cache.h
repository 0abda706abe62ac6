// Large CPU allocations from their own mappings, with a bounded cache of freed blocks (CPU ranks).
//
// PyTorch's CPU allocator is malloc. glibc serves a large block from mmap only until one is freed:
// then its mmap threshold rises to that size (up to 32 MiB), and later blocks come from the heap,
// where fragmentation keeps freed memory resident in amounts that differ by rank and by run (the
// 85M GPT's ZeRO-2 peak moved 1656–1807 MiB across runs). Fixing the threshold makes the resident
// set follow the live bytes, but every activation then faults fresh zeroed pages in (−7% there).
//
// This allocator serves blocks of at least `threshold` bytes from mmap and, when one is freed,
// keeps it in a cache for the next request of (nearly) the same size — a step allocates the same
// shapes as the last one — so most blocks are reused without faulting pages in. The cache may hold
// `capacity` bytes, or more while blocks in use are below their high-water mark: up to that mark
// minus what is in use. A step's activations, freed during backward, then wait for the next
// forward instead of being unmapped and faulted in again (the 4.8M GPT at micro 8 frees ~170 MiB
// of them a step: a 64 MiB cache missed 18 blocks a step, its forward ran 15% slower than DDP's),
// and the resident set is still at most the larger of (in use + capacity) and the high-water mark:
// never above the peak it would reach without a cache, plus capacity (a request the cache cannot
// serve shrinks it before a new block is mapped). release_cached() unmaps the
// cache and restarts the mark from what is in use (so construction's transients do not count: the
// engine calls it through release_free_heap()). Capacity 0 caches nothing. Smaller requests go to
// the allocator it replaced.
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>
#include <cstdint>
#include <map>

namespace tessera {

struct CpuBlockCacheStats {
  int64_t hits = 0;           // large requests served from the cache
  int64_t misses = 0;         // large requests that mapped a new block
  int64_t evictions = 0;      // cached blocks unmapped to keep the cache within its capacity
  int64_t cached_bytes = 0;   // bytes held in the cache now
  int64_t mapped_bytes = 0;   // bytes of large blocks in use now (not counting the cache)
};

class CpuBlockCache final : public c10::Allocator {
 public:
  // glibc's own initial mmap threshold: every block glibc would map before its threshold rises is
  // ours. (At 1 MiB, the 4.8M GPT's blocks of 128 KiB–1 MiB went to the heap, whose freed pages
  // made its peak differ by 2–5 MiB between ranks and runs; at 128 KiB they agree within 0.4 MiB.)
  static constexpr int64_t kDefaultThresholdBytes = int64_t{128} << 10;
  static constexpr int64_t kDefaultCapacityMiB = 64;

  // `small` serves requests below `threshold` bytes; a cached block serves a request up to 1/8
  // smaller than itself.
  CpuBlockCache(c10::Allocator* small, int64_t threshold_bytes, int64_t capacity_bytes);
  ~CpuBlockCache() override;

  c10::DataPtr allocate(size_t bytes) override;
  // Frees what allocate() returned, large or small, for PyTorch's raw_allocate/raw_deallocate
  // (ATen uses them for scratch buffers); nullptr if the small allocator has no raw deleter.
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, size_t count) const override { default_copy_data(dest, src, count); }

  CpuBlockCacheStats stats() const;
  int64_t capacity_bytes() const { return capacity_; }
  // The most bytes of large blocks in use at once since the last release_cached().
  int64_t peak_in_use_bytes() const;
  // Unmaps every cached block (blocks in use are untouched) and restarts the high-water mark of
  // blocks in use from what is in use now.
  void release_cached();

  // The process's cache, installed as PyTorch's CPU allocator on the first call; later calls return
  // it. TESSERA_CPU_BLOCK_CACHE_MIB sets the capacity (unset: kDefaultCapacityMiB; negative: not
  // installed, returns nullptr), TESSERA_CPU_BLOCK_THRESHOLD_KIB the smallest block it serves
  // (unset: kDefaultThresholdBytes; at least 4). Never destroyed: tensors may outlive any owner.
  static CpuBlockCache* install_from_environment();
  // The installed cache, nullptr before install_from_environment() or when it installed none.
  static CpuBlockCache* installed();

 private:
  struct Block {
    CpuBlockCache* owner;
    size_t bytes;      // the mapping's length (page multiple)
    uint64_t age = 0;  // when it entered the cache
  };
  // The deleter of every large block: finds the block by address in the registry of blocks in use.
  static void free_large(void* data);
  void give_back(void* base, Block block);      // with the lock held
  void evict_oldest();                          // with the lock held
  int64_t cache_limit(int64_t in_use) const;    // with the lock held
  void trim_cache_to(int64_t bytes);            // with the lock held: oldest first

  c10::Allocator* small_;
  const size_t threshold_;
  const int64_t capacity_;
  std::multimap<size_t, void*> by_size_;  // cached blocks by length
  std::map<uint64_t, void*> by_age_;      // the same blocks, oldest first
  std::map<void*, Block> cached_;         // the same blocks by address
  uint64_t clock_ = 0;
  int64_t peak_in_use_ = 0;  // high-water mark of stats_.mapped_bytes since the last release_cached()
  CpuBlockCacheStats stats_;
};

}  // namespace tessera
