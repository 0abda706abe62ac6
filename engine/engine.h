// Engine: the composition root. Built from a Config, a ParallelContext and a model description
// (its parameters, in groups), it owns the flat buffers, the gradient reducer, the optimizer, the
// loss scaler and the LR schedule, and drives one training step in DeepSpeed's shape:
//
//   for each micro-batch:  loss = model(batch);  engine.backward(loss);  engine.step();
//
// `step()` applies the optimizer only at a gradient-accumulation boundary (every
// gradient_accumulation_steps micro-steps), as DeepSpeed's engine does. The engine never sees the
// model's code: C++ and Python models hand it the same parameter lists.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/config.h"

namespace tessera {

class ParallelContext;
class ZeroOptimizer;
class LossScaler;
class LrSchedule;
class ProgressMeter;

struct ParamGroup {
  std::vector<at::Tensor> params;  // leaf tensors; the engine re-points them into its flat buffer
  std::optional<double> lr;            // overrides optimizer.params.lr (a factor of the schedule)
  std::optional<double> weight_decay;  // overrides optimizer.params.weight_decay
  std::string name;
  std::vector<std::string> param_names;  // optional, one per parameter: named in errors
};

struct ModelDescription {
  std::vector<ParamGroup> groups;
};

// Per-rank bytes held by the engine's own buffers (not activations), measured from the buffers.
struct MemoryReport {
  int64_t parameters = 0;        // compute-dtype parameters (the model's tensors)
  int64_t master_parameters = 0; // fp32 master slice (mixed precision only)
  int64_t gradients = 0;         // fp32 gradient accumulation (full, or this rank's slice)
  int64_t optimizer_states = 0;  // moments etc., this rank's slice
  int64_t buckets = 0;           // communication staging buffers
  int64_t total() const { return parameters + master_parameters + gradients + optimizer_states + buckets; }
};

class Engine {
 public:
  Engine(Config config, ParallelContext& parallel, ModelDescription model);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Scales the loss (1/gradient_accumulation_steps, and the fp16 loss scale) and runs autograd;
  // gradients are folded into the engine's fp32 buffers and reduced in buckets as they arrive.
  // If autograd throws (a caught KeyboardInterrupt, out of memory), the gradients accumulated since
  // the last optimizer step are discarded and the accumulation window starts again; the exception
  // is rethrown. No host synchronization: the loss is read only when a progress line is due.
  void backward(const at::Tensor& loss);
  // At a boundary: finish reductions, unscale and check overflow, clip, optimizer step, allgather,
  // advance the LR schedule. Otherwise only counts the micro-step.
  void step();
  bool is_gradient_accumulation_boundary() const;
  void zero_grad();

  // Tells the progress line how many samples (and tokens) the last micro-batch had on this rank.
  void record_batch(int64_t samples, int64_t tokens = 0);

  int64_t global_step() const { return global_step_; }
  int64_t micro_step() const { return micro_step_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  double learning_rate() const;
  double loss_scale() const;
  double last_grad_norm() const { return last_grad_norm_; }
  double last_loss() const;  // this rank's last micro-batch loss (reads it from the device)
  const Config& config() const { return config_; }
  ParallelContext& parallel() { return parallel_; }
  MemoryReport memory() const;

 private:
  void optimizer_step();

  Config config_;
  ParallelContext& parallel_;
  std::unique_ptr<ZeroOptimizer> zero_;
  std::unique_ptr<LossScaler> scaler_;
  std::unique_ptr<LrSchedule> schedule_;
  std::unique_ptr<ProgressMeter> progress_;
  int64_t gradient_accumulation_steps_ = 1;
  int64_t global_step_ = 0;
  int64_t micro_step_ = 0;
  int64_t skipped_steps_ = 0;
  double last_grad_norm_ = 0;
  at::Tensor last_loss_;          // the last micro-batch's loss, on its device
  at::Tensor interval_loss_sum_;  // losses since the last progress line, on the data group's device
  int64_t interval_losses_ = 0;
  std::chrono::steady_clock::time_point last_step_end_;
};

}  // namespace tessera
