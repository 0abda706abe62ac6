// The host's optimizer step overlapped with the backward (offload_optimizer.super_offload), exact.
//
// With the optimizer on the host (ZeRO-Offload), a step waits for the whole backward and then for
// the whole CPU step. Each bucket's chunk could be stepped as soon as its reduced gradient has
// reached the host, while the GPU goes on with the backward, but two things decided only at the end
// can change the step: clipping (the global gradient norm) and a non-finite gradient (the step is
// skipped). So the step is speculated and validated afterwards, as in Zero Bubble's
// post-validation (Qi et al. 2024) and SuperOffload's speculation-then-validation (Lian et al.
// 2025): each chunk is stepped, on a thread of its own, with the inputs the step will have when
// nothing global intervenes (clipping coefficient 1, the step applied), after copying what the
// step writes (fp32 master, optimizer state, compute copy) aside. apply() then compares the actual
// inputs with the speculated ones: equal, the stepped chunks stand and only their copies to the
// device and allgathers remain; different (clipping took effect), every stepped chunk is restored
// from its copy and the step runs as without speculation; a skipped step (overflow) restores them
// too. The result is the unspeculated step's, bit for bit; the price is host memory for the copies
// (the written arrays once more) and their copy traffic, both off the critical path.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "csrc/device_stream.h"
#include "optim/flat_optimizer.h"

namespace tessera {

// Deliberate faults for the tests that show the speculation's checks can fail (ZeroOptions; from
// TESSERA_TEST_SPECULATION_FAULT): each makes the result differ from the unspeculated step.
enum class SpeculationFault {
  None,
  Early,       // speculation starts at the window's first micro-step: chunks stepped before their last gradient
  Unchecked,   // apply() keeps the speculated chunks without comparing the inputs
  Unrestored,  // a rollback forgets to restore the chunks from their copies
};

class SpeculativeStep {
 public:
  // Steps bucket `bucket` of group `group` with `in` (on the worker thread).
  using StepBucket = std::function<void(int group, int bucket, const StepInputs& in)>;
  // The arrays that step writes, as views (saved before it, restored by a rollback).
  using WrittenArrays = std::function<std::vector<at::Tensor>(int group, int bucket)>;

  // `buckets[g]`: group g's bucket count, 0 for a group never speculated. The thread's parallel
  // regions run on `threads_share` of the process's threads (csrc/cpu_adam.h).
  SpeculativeStep(std::vector<int> buckets, StepBucket step, WrittenArrays written, double threads_share = 1.0,
                  SpeculationFault fault = SpeculationFault::None);
  ~SpeculativeStep();
  SpeculativeStep(const SpeculativeStep&) = delete;
  SpeculativeStep& operator=(const SpeculativeStep&) = delete;

  bool speculates(int group) const { return buckets_.at(group) > 0; }
  // A backward begins: when it ends an accumulation (`boundary`), its chunks will be stepped with
  // in[g] for group g; whatever an earlier speculation left is rolled back first.
  void begin(std::vector<StepInputs> in, bool boundary);
  bool open() const;
  // Group g's bucket's gradient is final and on the host once `landed` has passed: its step is
  // queued. Nothing while no speculation is open, or for a group never speculated.
  void submit(int group, int bucket, DeviceEvent landed);
  // apply(): waits for the queued steps, then keeps them when `actual` equals what was speculated
  // (returns [group][bucket] = 1 for each chunk stepped) or restores every stepped chunk (returns
  // all zeros). A step that threw is rethrown, after the restore.
  std::vector<std::vector<char>> settle(const std::vector<StepInputs>& actual);
  // Undoes an open speculation (a skipped step, an aborted backward, a read of the state between
  // backward and step): waits, restores every stepped chunk. Nothing when none is open.
  void cancel();

  struct Counts {
    int64_t committed = 0;    // speculations kept by apply()
    int64_t rolled_back = 0;  // speculations restored (settle with other inputs, or cancel)
    int64_t chunks = 0;       // chunks stepped during a backward
  };
  Counts counts() const;
  int64_t copy_bytes() const;  // host memory of the copies taken before each chunk's step

 private:
  struct Task {
    int group, bucket;
    DeviceEvent landed;
  };
  void run(double threads_share);  // the worker thread
  void wait_idle(std::unique_lock<std::mutex>& lock);
  void restore_stepped();     // with the worker idle
  void roll_back(std::unique_lock<std::mutex>& lock);  // an open speculation restored and closed
  void close();               // nothing stepped or submitted, no error, nothing open
  void step_one(const Task& t, bool& copied);

  const std::vector<int> buckets_;
  const StepBucket step_;
  const WrittenArrays written_;
  const SpeculationFault fault_;

  mutable std::mutex mutex_;
  std::condition_variable work_, idle_;
  std::deque<Task> queue_;
  bool busy_ = false, stopping_ = false, open_ = false;
  bool early_ = false;  // SpeculationFault::Early, before the boundary: chunks stepped as they are submitted
  std::exception_ptr error_;
  std::vector<StepInputs> in_;                    // the speculated inputs, by group
  std::vector<std::vector<char>> stepped_;        // [group][bucket]: stepped (its copy taken)
  std::vector<std::vector<char>> submitted_;      // [group][bucket]: queued once per speculation
  std::vector<std::vector<std::vector<at::Tensor>>> copies_;  // [group][bucket]: the arrays before the step
  Counts counts_;
  std::atomic<int64_t> copy_bytes_{0};
  std::thread worker_;
};

}  // namespace tessera
