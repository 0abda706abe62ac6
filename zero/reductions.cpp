#include "zero/reductions.h"

#include <ATen/ops/empty.h>

#include <algorithm>

namespace tessera {

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

at::Tensor Reductions::acquire_staging(int64_t numel) {
  // Reuse a free staging buffer; while none is free, finish the oldest reduction (bounded memory).
  while (staging_free_.empty() && !in_flight_.empty()) wait_oldest();
  at::Tensor base;
  if (!staging_free_.empty()) {
    base = staging_free_.back();
    staging_free_.pop_back();
  } else {
    base = at::empty({std::max(numel, staging_numel_)}, at::TensorOptions().dtype(at::kFloat).device(device_));
    staging_bytes_ += base.nbytes();
  }
  return base.narrow(0, 0, numel).zero_();
}

void Reductions::release_staging(const at::Tensor& staging) {
  // acquire_staging hands out a narrowed view: the whole buffer goes back to the free list.
  staging_free_.push_back(staging._base().defined() ? at::Tensor(staging._base()) : staging);
}

at::Tensor Reductions::receive_buffer(int64_t numel) {
  at::Tensor out = at::empty({numel}, at::TensorOptions().dtype(at::kFloat).device(device_));
  receive_bytes_now_ += out.nbytes();  // every receive buffer in flight counts, until it is folded in
  receive_bytes_peak_ = std::max(receive_bytes_peak_, receive_bytes_now_);
  return out;
}

}  // namespace tessera
