// Handing the heap's freed pages back to the OS between training steps (CPU ranks, glibc).
//
// A step frees as much as it allocates (autograd's per-parameter gradients, activations, the
// backend's buffers), but glibc keeps freed memory in its arenas, and fragmentation lets the
// resident set creep up by MiBs a step (85M GPT on 2 ranks: +10–15 MiB a step, 1820 → 2315 MiB
// in 30 steps). malloc_trim(0) after every step holds it flat but costs 11–16% of a small model's
// step, because the next step faults the pages in again. So the trimmer trims once after the first
// step (what construction freed: the model's own tensors, ZeRO-3's whole buffers), then only when
// the resident set has grown by more than a bound over the working set, taken as the largest
// resident set of the next few steps (buffers, optimizer state and the allocator's pools settle
// over several steps). The cost is paid every few dozen steps, and the peak stays within the bound
// of the working set.
#pragma once

#include <cstdint>
#include <functional>

namespace tessera {

class HeapTrimmer {
 public:
  static constexpr int kDefaultWarmupSteps = 5;
  static constexpr int64_t kDefaultBoundMiB = 16;

  // bound_bytes < 0: never trim; 0: after every step. Otherwise the first step trims and the next
  // warmup_steps steps only measure the working set. The readers are for tests.
  explicit HeapTrimmer(int64_t bound_bytes, int warmup_steps = kDefaultWarmupSteps,
                       std::function<int64_t()> resident_bytes = {}, std::function<void()> trim = {});
  // TESSERA_HEAP_TRIM_MIB: the bound in MiB (unset: kDefaultBoundMiB; negative: off; 0: after
  // every step).
  static HeapTrimmer from_environment();

  // Call after each optimizer step; returns whether it trimmed.
  bool after_step();
  int64_t trims() const { return trims_; }
  int64_t bound_bytes() const { return bound_; }

 private:
  int64_t bound_;
  std::function<int64_t()> resident_bytes_;
  std::function<void()> trim_;
  int warmup_steps_;
  int64_t steps_ = 0;
  int64_t baseline_ = -1;  // the working set: the largest of the warm-up steps, raised by each trim
  int64_t trims_ = 0;
};

// This process's resident set in bytes (/proc/self/statm), -1 where unknown.
int64_t resident_set_bytes();
// glibc's malloc_trim(0) where available: what the trimmer does after a step (the large-block
// cache bounds itself and keeps the blocks the next step reuses).
void trim_glibc_heap();
// The large-block cache's cached blocks (csrc/cpu_block_cache.h, restarting its high-water mark),
// then trim_glibc_heap(): after construction, so its transients leave the resident set.
void release_free_heap();

}  // namespace tessera
