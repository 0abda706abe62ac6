// The gradient reductions of one backward in flight, and the buffers they borrow.
//
// Reductions finish in launch order (wait_oldest). Stage 2 fills each bucket's gradients in a
// staging buffer taken from a small pool: while none is free the oldest reduction is finished
// first, so the pool stays bounded (one buffer per bucket being filled or reduced). Receive chunks
// (a reduce-scatter's output) are counted while they are alive, for MemoryReport::buckets.
#pragma once

#include <ATen/core/Tensor.h>

#include <deque>
#include <functional>
#include <vector>

#include "parallel/communicator.h"

namespace tessera {

class Reductions {
 public:
  // `staging_numel`: the size every staging buffer is allocated at (the largest bucket).
  Reductions(c10::Device device, int64_t staging_numel) : device_(device), staging_numel_(staging_numel) {}
  ~Reductions() { drop(); }

  void set_staging_numel(int64_t numel) { staging_numel_ = numel; }

  // `finish` runs after the collective completed (folds the result in, returns buffers).
  void push(CommHandle handle, std::function<void()> finish = {});
  void wait_oldest();
  void wait_all();
  // Forgets what is in flight without waiting (an aborted backward whose peers did not all take
  // part, or a destructor): the c10d work keeps its tensors alive until the backend is done.
  void drop() { in_flight_.clear(); }
  bool empty() const { return in_flight_.empty(); }

  at::Tensor acquire_staging(int64_t numel);  // zeroed, `numel` elements
  void release_staging(const at::Tensor& staging);
  at::Tensor receive_buffer(int64_t numel);   // fp32, uninitialized, counted until released
  void release_receive(const at::Tensor& out) { receive_bytes_now_ -= out.nbytes(); }

  int64_t staging_bytes() const { return staging_bytes_; }
  int64_t receive_bytes_peak() const { return receive_bytes_peak_; }

 private:
  struct InFlight {
    CommHandle handle;
    std::function<void()> finish;
  };
  c10::Device device_;
  int64_t staging_numel_;
  std::deque<InFlight> in_flight_;
  std::vector<at::Tensor> staging_free_;
  int64_t staging_bytes_ = 0;
  int64_t receive_bytes_now_ = 0, receive_bytes_peak_ = 0;
};

}  // namespace tessera
