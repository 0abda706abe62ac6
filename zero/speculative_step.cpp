#include "zero/speculative_step.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty_like.h>

#include <algorithm>
#include <utility>

#include "csrc/cpu_adam.h"

namespace tessera {
namespace {

bool same_inputs(const StepInputs& a, const StepInputs& b) {
  return a.step == b.step && a.lr == b.lr && a.weight_decay == b.weight_decay && a.grad_scale == b.grad_scale &&
         a.beta1 == b.beta1 && a.beta2 == b.beta2;
}

}  // namespace

SpeculativeStep::SpeculativeStep(std::vector<int> buckets, StepBucket step, WrittenArrays written,
                                 double threads_share, SpeculationFault fault)
    : buckets_(std::move(buckets)), step_(std::move(step)), written_(std::move(written)), fault_(fault) {
  stepped_.resize(buckets_.size());
  submitted_.resize(buckets_.size());
  copies_.resize(buckets_.size());
  for (size_t g = 0; g < buckets_.size(); ++g) {
    stepped_[g].assign(buckets_[g], 0);
    submitted_[g].assign(buckets_[g], 0);
    copies_[g].resize(buckets_[g]);
  }
  worker_ = std::thread([this, threads_share] { run(threads_share); });
}

SpeculativeStep::~SpeculativeStep() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  worker_.join();
}

void SpeculativeStep::begin(std::vector<StepInputs> in, bool boundary) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!boundary && fault_ != SpeculationFault::Early) return;
  // Early (a fault): the window's first micro-step opens it, and the boundary keeps what it stepped.
  if (fault_ == SpeculationFault::Early) early_ = !boundary;
  if (open_ && fault_ == SpeculationFault::Early) return;
  roll_back(lock);
  in_ = std::move(in);
  open_ = true;
}

bool SpeculativeStep::open() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return open_;
}

void SpeculativeStep::submit(int group, int bucket, DeviceEvent landed) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!open_ || !speculates(group) || submitted_[group][bucket]) return;
    submitted_[group][bucket] = 1;
    if (!early_) queue_.push_back({group, bucket, std::move(landed)});
  }
  if (early_) {  // the fault: stepped here and now, surely before the boundary's gradient arrives
    bool copied = false;
    step_one({group, bucket, std::move(landed)}, copied);
    std::lock_guard<std::mutex> lock(mutex_);
    stepped_[group][bucket] = copied;
    return;
  }
  work_.notify_one();
}

void SpeculativeStep::run(double threads_share) {
  at::NoGradGuard no_grad;  // grad mode is the thread's own
  use_share_of_threads_here(threads_share);
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    Task task = std::move(queue_.front());
    queue_.pop_front();
    if (error_) {  // after a failed chunk, the rest are not stepped
      if (queue_.empty()) idle_.notify_all();
      continue;
    }
    busy_ = true;
    lock.unlock();
    std::exception_ptr failed;
    bool copied = false;  // once the copy is taken, a failed step is restored like a finished one
    try {
      step_one(task, copied);
    } catch (...) {
      failed = std::current_exception();
    }
    lock.lock();
    busy_ = false;
    if (failed) error_ = failed;
    else ++counts_.chunks;
    if (copied) stepped_[task.group][task.bucket] = 1;
    if (queue_.empty()) idle_.notify_all();
  }
}

void SpeculativeStep::step_one(const Task& t, bool& copied) {
  t.landed.wait();  // the chunk's gradient copy to the host has landed
  std::vector<at::Tensor> arrays = written_(t.group, t.bucket);
  std::vector<at::Tensor>& copy = copies_[t.group][t.bucket];
  if (copy.empty()) {  // allocated at the first speculation and kept: the same chunk every step
    for (const at::Tensor& a : arrays) {
      copy.push_back(at::empty_like(a));
      copy_bytes_ += a.nbytes();
    }
  }
  for (size_t i = 0; i < arrays.size(); ++i) copy[i].copy_(arrays[i]);
  copied = true;
  step_(t.group, t.bucket, in_[t.group]);
}

void SpeculativeStep::wait_idle(std::unique_lock<std::mutex>& lock) {
  idle_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

std::vector<std::vector<char>> SpeculativeStep::settle(const std::vector<StepInputs>& actual) {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_idle(lock);
  std::vector<std::vector<char>> kept(stepped_.size());
  for (size_t g = 0; g < stepped_.size(); ++g) kept[g].assign(stepped_[g].size(), 0);
  if (!open_) return kept;
  bool same = actual.size() == in_.size() && !error_;
  for (size_t g = 0; same && g < actual.size(); ++g) same = !speculates(static_cast<int>(g)) || same_inputs(actual[g], in_[g]);
  if (fault_ == SpeculationFault::Unchecked) same = !error_;
  std::exception_ptr error = error_;
  if (!same) {
    roll_back(lock);
  } else {
    kept = stepped_;
    ++counts_.committed;
    close();
  }
  if (error) std::rethrow_exception(error);
  return kept;
}

void SpeculativeStep::cancel() {
  std::unique_lock<std::mutex> lock(mutex_);
  roll_back(lock);
}

void SpeculativeStep::roll_back(std::unique_lock<std::mutex>& lock) {
  if (!open_) return;
  wait_idle(lock);
  restore_stepped();
  ++counts_.rolled_back;
  close();
}

void SpeculativeStep::close() {
  for (auto& s : stepped_) std::fill(s.begin(), s.end(), 0);
  for (auto& s : submitted_) std::fill(s.begin(), s.end(), 0);
  open_ = false;
  error_ = nullptr;
}

void SpeculativeStep::restore_stepped() {
  if (fault_ == SpeculationFault::Unrestored) return;
  at::NoGradGuard no_grad;
  for (size_t g = 0; g < stepped_.size(); ++g)
    for (size_t b = 0; b < stepped_[g].size(); ++b) {
      if (!stepped_[g][b]) continue;
      std::vector<at::Tensor> arrays = written_(static_cast<int>(g), static_cast<int>(b));
      for (size_t i = 0; i < arrays.size(); ++i) arrays[i].copy_(copies_[g][b][i]);
    }
}

SpeculativeStep::Counts SpeculativeStep::counts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

int64_t SpeculativeStep::copy_bytes() const { return copy_bytes_; }

}  // namespace tessera
