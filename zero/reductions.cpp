#include "zero/reductions.h"

#include <ATen/ops/empty.h>

#include <algorithm>

namespace tessera {

void Reductions::make_room() {
  while (in_flight_.size() >= kMaxInFlight) wait_oldest();
}

void Reductions::push(CommHandle handle, std::function<void()> finish) {
  in_flight_.push_back({std::move(handle), std::move(finish)});
}

void Reductions::wait_oldest() {
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  f.handle.wait();
  if (f.finish) f.finish();
}

void Reductions::wait_all() {
  while (!in_flight_.empty()) wait_oldest();
}

at::Tensor Reductions::acquire_staging(int pool, int64_t numel) {
  std::vector<at::Tensor>& free = pools_.at(pool);
  // Reuse a free buffer of this group; past the pool's two, finish the oldest reduction (it may
  // return one) before allocating another.
  while (free.empty() && allocated_.at(pool) >= kBuffersPerPool && !in_flight_.empty()) wait_oldest();
  at::Tensor base;
  if (!free.empty()) {
    base = free.back();
    free.pop_back();
  } else {
    base = at::empty({std::max(numel, pool_numel_.at(pool))}, at::TensorOptions().dtype(at::kFloat).device(device_));
    staging_bytes_ += base.nbytes();
    staging_peak_bytes_ = std::max(staging_peak_bytes_, staging_bytes_);
    ++allocated_[pool];
  }
  return base.narrow(0, 0, numel).zero_();
}

void Reductions::release_staging(int pool, const at::Tensor& staging) {
  // acquire_staging hands out a narrowed view: the whole buffer goes back to the free list.
  pools_.at(pool).push_back(staging._base().defined() ? at::Tensor(staging._base()) : staging);
}

void Reductions::free_staging() {
  for (size_t pool = 0; pool < pools_.size(); ++pool) {
    for (const at::Tensor& buffer : pools_[pool]) staging_bytes_ -= buffer.nbytes();
    allocated_[pool] -= static_cast<int>(pools_[pool].size());
    pools_[pool].clear();
  }
}

}  // namespace tessera
