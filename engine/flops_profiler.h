// The flops profiler for models the engine runs in C++ (DeepSpeed's flops_profiler section): the
// arithmetic counted from the ATen ops themselves, attributed to the units (zero/units.h) whose
// forward is open. Python modules are profiled through their hooks instead
// (python/tessera/flops_profiler.py, the same rules and the same report).
//
// OpCounter: while one exists, every ATen op this thread runs passes a RecordFunction callback;
// the outermost op of a nest that does arithmetic counts (a linear counts once, not again for the
// addmm it runs), by DeepSpeed's rules:
//   linear            MACs = numel(input) · out_features
//   matmul, mm, bmm   MACs = numel(a) · b.size(-1); addmm, baddbmm the same, flops + numel(bias)
//   scaled_dot_product_attention   MACs = numel(q) · Lk + numel(q[..., 0]) · Lk · dv
//   convolutions      MACs = numel(output) · in_channels/groups · kernel size
//   flops = 2 · MACs for these; layer_norm and rms_norm 5 flops an element (4 without a weight);
//   relu, gelu, silu, softmax 1; everything else (embedding, dropout, the optimizer) 0.
// UnitFlopsProfiler: on the rank that prints, during optimizer step `profile_step` (counted from
// 1), counts every forward op outside the backward (a backward's recomputation under activation
// checkpointing is left to recompute_fwd_factor, as DeepSpeed does), adds it to each open unit,
// times each unit's forward, and at the step's end prints DeepSpeed's report: per unit and for the
// model, parameters, MACs, forward latency and FLOP/s; the backward as 2 × the forward; the
// iteration's FLOP/s and, given peak_tflops, the MFU.
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "zero/units.h"

namespace tessera {

struct StepTimes;

struct OpCount {
  int64_t flops = 0, macs = 0;
};

// Counts this thread's ATen ops from construction to destruction, calling `add` for each counted
// op once it has run. One per thread at a time; paused() ops are not counted.
class OpCounter {
 public:
  explicit OpCounter(std::function<void(const OpCount&)> add);
  ~OpCounter();
  OpCounter(const OpCounter&) = delete;
  OpCounter& operator=(const OpCounter&) = delete;
  void set_paused(bool paused) { paused_ = paused; }

 private:
  friend struct OpCounterCallbacks;  // flops_profiler.cpp's RecordFunction callbacks
  std::function<void(const OpCount&)> add_;
  uint64_t handle_ = 0;
  int depth_ = 0;  // counted ops open on this thread (their inner ops are not counted again)
  bool paused_ = false;
};

// The report's numbers (also what tests read).
struct UnitProfile {
  std::string name;
  int64_t params = 0;
  OpCount forward;
  double latency_s = 0;  // its forwards, summed
};
struct FlopsProfile {
  int64_t profile_step = 0;
  int64_t params = 0;
  OpCount forward;        // every counted forward op of the step, inside units or not
  double forward_s = 0, backward_s = 0, step_s = 0;
  std::vector<UnitProfile> units;
};

// What the report says about the run besides the counts.
struct FlopsRunLayout {
  int world = 1, data = 1, tensor = 1, pipe = 1;
  int64_t batch_size = 0;  // samples per optimizer step on this rank (micro-batch × accumulation)
  c10::Device device = c10::Device(c10::kCPU);
};

class UnitFlopsProfiler final : public UnitListener {
 public:
  UnitFlopsProfiler(FlopsProfilerConfig config, UnitTracker& units, int64_t params, FlopsRunLayout layout);
  ~UnitFlopsProfiler() override;
  UnitFlopsProfiler(const UnitFlopsProfiler&) = delete;
  UnitFlopsProfiler& operator=(const UnitFlopsProfiler&) = delete;

  // The engine's calls: a backward began or ended (or was abandoned); an optimizer step ended
  // (global_step now counts it), with the wall-clock totals so far. At construction, step 0 ended.
  void backward_began();
  void backward_ended();
  void step_ended(int64_t global_step, const StepTimes& totals);
  // The last report's numbers (empty before profile_step).
  const FlopsProfile& profile() const { return profile_; }

  void on_unit_event(int unit, UnitEvent event) override;

 private:
  using Clock = std::chrono::steady_clock;
  void start(const StepTimes& totals);
  void finish(int64_t global_step, const StepTimes& totals);
  void add(const OpCount& n);
  void report() const;

  FlopsProfilerConfig config_;
  UnitTracker& units_;
  FlopsRunLayout layout_;
  FlopsProfile profile_;
  std::unique_ptr<OpCounter> counter_;  // while profiling
  bool in_backward_ = false, done_ = false;
  bool units_entered_ = false;          // the model reported a unit in the profiled step
  std::vector<int> open_;               // units whose forward is open, outermost first
  std::vector<Clock::time_point> unit_start_;
  double forward_before_ = 0, backward_before_ = 0, step_before_ = 0;
};

}  // namespace tessera
