// The gradient reductions of one backward in flight, and the staging buffers they borrow.
//
// Reductions finish in launch order (wait_oldest), and at most kMaxInFlight are in flight: a
// backend may hold a copy of each one's bucket until it completes (Gloo's reduce-scatter copies
// its input), so the queue bounds that too, and one collective runs while the next waits
// (a Gloo group runs its collectives one at a time anyway). Stage 2 fills each bucket's gradients in a
// staging buffer taken from its group's pool (buffers of the group's largest bucket). A pool holds
// two buffers, so one bucket fills while the one before it is reduced; past two, a request first
// finishes the oldest reduction, and allocates only when nothing is in flight (more buckets of the
// group filling at once than the plan's bound, zero/buffer_plan.h). Reduce-scatters run in place
// (the output is the input's own chunk: parallel/communicator.h), so no receive buffers exist.
#pragma once

#include <ATen/core/Tensor.h>

#include <deque>
#include <functional>
#include <vector>

#include "parallel/communicator.h"

namespace tessera {

class Reductions {
 public:
  explicit Reductions(c10::Device device) : device_(device) {}
  ~Reductions() { drop(); }

  // One staging pool per parameter group, of buffers of `numel[g]` elements (its largest bucket).
  void set_staging_pools(std::vector<int64_t> numel) {
    pools_.assign(numel.size(), {});
    allocated_.assign(numel.size(), 0);
    pool_numel_ = std::move(numel);
  }
  static constexpr int kBuffersPerPool = 2;  // double buffering: fill one, reduce the other

  static constexpr size_t kMaxInFlight = 2;

  // `finish` runs after the collective completed (folds the result in, returns buffers). Call
  // make_room() before launching the collective: it finishes the oldest while kMaxInFlight are queued.
  void make_room();
  void push(CommHandle handle, std::function<void()> finish = {});
  void wait_oldest();
  void wait_all();
  // Forgets what is in flight without waiting (an aborted backward whose peers did not all take
  // part, or a destructor): the c10d work keeps its tensors alive until the backend is done.
  void drop() { in_flight_.clear(); }
  bool empty() const { return in_flight_.empty(); }

  at::Tensor acquire_staging(int pool, int64_t numel);  // zeroed, `numel` elements
  void release_staging(int pool, const at::Tensor& staging);

  // Hands every pooled buffer back to the allocator once a backward's reductions are done, so
  // they do not sit under the next forward's activations (where a step's peak is); the next
  // backward takes them again (from the CPU block cache, or CUDA's caching allocator).
  void free_staging();
  int64_t staging_bytes() const { return staging_peak_bytes_; }  // most staging held at once

 private:
  struct InFlight {
    CommHandle handle;
    std::function<void()> finish;
  };
  c10::Device device_;
  std::deque<InFlight> in_flight_;
  std::vector<std::vector<at::Tensor>> pools_;  // free buffers, per group
  std::vector<int64_t> pool_numel_;
  std::vector<int> allocated_;  // buffers each pool holds (free or lent out)
  int64_t staging_bytes_ = 0;       // held now
  int64_t staging_peak_bytes_ = 0;
};

}  // namespace tessera
