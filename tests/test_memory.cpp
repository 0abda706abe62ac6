// Peak process memory of ZeRO stages 1 and 2 against the accounting (zero/buffer_plan.h,
// docs/zero.md). Two ranks train a ~50M-parameter deep MLP (tests/engine_worker.cpp --rss), one
// process per stage and dtype; each rank's peak resident set size at stage s minus stage 0's must
// equal the planner's difference in bytes within max(5%, 32 MiB). This measures the process, not
// the engine's counters: a transient buffer anywhere (a receive chunk, a clone before an allgather,
// a backend's copy) shows up here.
//
// The workers run tessera's large-block allocator with no cache (TESSERA_CPU_BLOCK_CACHE_MIB=0,
// csrc/cpu_block_cache.h), installed before the model is built: every block of 128 KiB or more is
// unmapped when freed, so the peak is what was live, not what glibc's heap or the cache kept (both
// differ by rank and run). Measured within 4–9 MiB of the accounting on every rank.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <map>
#include <regex>
#include <vector>

#include <ATen/ops/full.h>
#include <c10/core/CPUAllocator.h>

#include <thread>

#include "csrc/cpu_block_cache.h"
#include "csrc/heap_trim.h"
#include "subprocess.h"
#include "zero/buffer_plan.h"

using tessera::testing::contains;
using tessera::HeapTrimmer;
using tessera::resident_set_bytes;

namespace {

constexpr int kHidden = 1024, kLayers = 48, kBucket = 4000000;

// The plan of the worker's DeepMlp: weights [H×16, layers × H×H, 8×H] and biases [(layers+1) × H].
tessera::BufferPlan plan_of(int stage, const std::string& dtype) {
  tessera::BufferPlanInput in;
  std::vector<int64_t> weights = {int64_t(kHidden) * 16}, biases;
  for (int l = 0; l < kLayers; ++l) weights.push_back(int64_t(kHidden) * kHidden);
  weights.push_back(8 * kHidden);
  for (int l = 0; l <= kLayers; ++l) biases.push_back(kHidden);
  in.group_numels = {weights, biases};
  in.stage = stage;
  in.data_parallel = 2;
  in.compute_bytes = dtype == "fp32" ? 4 : 2;
  in.bucket_numel = kBucket;
  in.state_floats = 2;  // AdamW
  in.backend_copies_reductions = true;  // Gloo
  return tessera::plan_buffers(in);
}

int64_t accounted(const tessera::BufferPlan& p) {
  return p.parameter_bytes + p.master_bytes + p.gradient_bytes + p.state_bytes + p.communication_bytes;
}

std::vector<int64_t> peak_rss(int stage, const std::string& dtype) {
  auto r = tessera::testing::run(
      {TESSERA_CLI_PATH, "launch", "--nproc-per-node", "2", "--master-port",
       std::to_string(tessera::testing::free_port()), "--timeout", "60", "--", TESSERA_ENGINE_WORKER_PATH, "--rss",
       "--stage", std::to_string(stage), "--dtype", dtype, "--hidden", std::to_string(kHidden), "--layers",
       std::to_string(kLayers), "--mb", "2", "--steps", "3", "--bucket", std::to_string(kBucket)},
      {{"TESSERA_CPU_BLOCK_CACHE_MIB", "0"}}, 240);
  INFO(r.output);
  REQUIRE(r.status == 0);
  std::smatch m;
  const std::string pattern = "peak rss stage " + std::to_string(stage) + " dtype " + dtype + ": (\\d+) (\\d+)";
  REQUIRE(std::regex_search(r.output, m, std::regex(pattern)));
  std::printf("%s\n", m[0].str().c_str());
  return {std::stoll(m[1]), std::stoll(m[2])};
}

}  // namespace

TEST_CASE("peak RSS of ZeRO 1 and 2 falls from stage 0 by the accounting (2 ranks - 50M params - fp32 and bf16)") {
  for (std::string dtype : {"fp32", "bf16"}) {
    const std::vector<int64_t> base = peak_rss(0, dtype);
    const int64_t base_accounted = accounted(plan_of(0, dtype));
    for (int stage : {1, 2}) {
      const std::vector<int64_t> peak = peak_rss(stage, dtype);
      const int64_t expected = accounted(plan_of(stage, dtype)) - base_accounted;  // negative: a saving
      const double tolerance = std::max(0.05 * double(-expected), 32.0 * (1 << 20));
      for (int rank = 0; rank < 2; ++rank) {
        const int64_t measured = peak[rank] - base[rank];
        std::printf("%s stage %d rank %d: peak RSS minus stage 0's %.1f MiB, accounting %.1f MiB\n", dtype.c_str(),
                    stage, rank, measured / 1048576.0, expected / 1048576.0);
        INFO(dtype << " stage " << stage << " rank " << rank << ": measured " << measured << " bytes, accounting "
                   << expected);
        CHECK(std::abs(double(measured - expected)) <= tolerance);
      }
    }
  }
}

TEST_CASE("heap trimmer: trims after the first step - then only once the resident set outgrows the warm-up steps' by the bound") {
  int64_t rss = 900;
  int trims = 0;
  HeapTrimmer trimmer(100, 3, [&] { return rss; }, [&] { ++trims, rss -= 150; });
  CHECK(trimmer.after_step());  // the first step: what construction freed goes back
  CHECK(trims == 1);
  rss = 900;
  CHECK_FALSE(trimmer.after_step());  // three warm-up steps: the largest, 1000, is the reference
  rss = 1000;
  CHECK_FALSE(trimmer.after_step());
  rss = 980;
  CHECK_FALSE(trimmer.after_step());
  rss = 1100;
  CHECK_FALSE(trimmer.after_step());  // within the bound
  rss = 1101;
  CHECK(trimmer.after_step());  // past it: trimmed back to 951, the reference stays 1000
  CHECK(trims == 2);
  rss = 1090;
  CHECK_FALSE(trimmer.after_step());
  // A working set that really grew: after the trim it is still 1250, which becomes the reference.
  rss = 1400;
  CHECK(trimmer.after_step());
  rss = 1300;
  CHECK_FALSE(trimmer.after_step());
  CHECK(trimmer.trims() == 3);

  // Had the first measured step been the reference (900), 1001 would have trimmed.
  HeapTrimmer warm(100, 2, [&] { return rss; }, [&] { ++trims; });
  warm.after_step();  // the first step's trim
  rss = 900;
  warm.after_step();
  rss = 1000;
  warm.after_step();
  rss = 1090;
  CHECK_FALSE(warm.after_step());

  trims = 0;
  HeapTrimmer never(-1, 0, [&] { return rss * 10; }, [&] { ++trims; });
  CHECK_FALSE(never.after_step());
  CHECK_FALSE(never.after_step());
  HeapTrimmer always(0, 5, [&] { return rss; }, [&] { ++trims; });
  CHECK(always.after_step());  // no warm-up when trimming every step
  CHECK(always.after_step());
  CHECK(trims == 2);
}

TEST_CASE("heap trimmer: glibc hands freed heap pages back") {
  // Fragment the heap: 200 blocks of 256 KiB (in the heap once the mmap threshold is raised by a
  // freed 4 MiB mmap), free all but the last so the heap top cannot shrink, then trim.
  void* big = std::malloc(4 << 20);
  std::memset(big, 1, 4 << 20);
  std::free(big);
  std::vector<void*> blocks;
  for (int i = 0; i < 200; ++i) {
    blocks.push_back(std::malloc(256 << 10));
    std::memset(blocks.back(), 1, 256 << 10);
  }
  for (int i = 0; i + 1 < 200; ++i) std::free(blocks[i]);
  const int64_t before = resident_set_bytes();
  REQUIRE(before > 0);
  HeapTrimmer trimmer(0);
  CHECK(trimmer.after_step());
  const int64_t after = resident_set_bytes();
  std::free(blocks.back());
  INFO("resident before " << before / 1024 << " KiB, after " << after / 1024 << " KiB");
  CHECK(after < before - (20 << 20));  // most of the ~50 MiB freed went back
}

// ---- the large-block cache (csrc/cpu_block_cache.h) ------------------------------------------------

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
