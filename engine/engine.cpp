#include "engine/engine.h"

#include <ATen/ops/zeros.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "csrc/cpu_features.h"
#include "engine/config_io.h"
#include "engine/config_support.h"
#include "engine/progress.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "parallel/parallel_context.h"
#include "zero/zero_optimizer.h"

namespace tessera {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

Engine::Engine(Config config, ParallelContext& parallel, ModelDescription model)
    : config_(std::move(config)), parallel_(parallel) {
  if (!config_.gradient_accumulation_steps || !config_.train_micro_batch_size_per_gpu)
    throw std::invalid_argument("tessera: the config's batch sizes are not resolved; build it with load_config() "
                                "or resolve_config() for this world size");
  const GridShape& grid = parallel_.grid();
  if (grid.tensor != config_.tensor_parallel.tp_size || grid.pipe != config_.pipeline.stages)
    throw std::invalid_argument("tessera: the parallel context (" + grid.str() +
                                ") does not match the config's tensor_parallel.tp_size and pipeline.stages");
  // Keys the engine does not act on yet (engine/config_support.h): errors refuse the config, the
  // rest are named once on rank 0.
  std::string refused, ignored;
  for (const ConfigIssue& issue : engine_support_issues(config_))
    (issue.severity == ConfigIssue::Severity::Error ? refused : ignored) += "  " + issue.str() + "\n";
  if (!refused.empty()) throw ConfigError("tessera: the engine cannot run this config:\n" + refused);
  const bool printer = parallel_.rank() == 0;
  if (printer && !ignored.empty()) std::printf("[tessera] config keys the engine ignores:\n%s", ignored.c_str());
  // bf16 on a CPU without bf16 arithmetic: every matmul converts through fp32, ~11x slower.
  if (printer && config_.bf16.enabled && parallel_.data().device().is_cpu() && !cpu_has_fast_bf16())
    std::printf("[tessera] note: bf16 is enabled but this CPU has %s: PyTorch emulates bf16 matmuls "
                "through fp32, about 11x slower than fp32 here. Disable bf16 on this machine for speed "
                "(fp32 uses more memory for parameters and activations).\n",
                cpu_bf16_missing().c_str());
  if (printer) std::fflush(stdout);
  gradient_accumulation_steps_ = *config_.gradient_accumulation_steps;
  zero_ = std::make_unique<ZeroOptimizer>(config_, parallel_, model);
  scaler_ = make_loss_scaler(config_.fp16, config_.bf16.enabled);
  schedule_ = make_lr_schedule(config_.scheduler, config_.optimizer->params.lr);
  progress_ = std::make_unique<ProgressMeter>(config_.steps_per_print, config_.wall_clock_breakdown,
                                              parallel_.rank() == 0, grid.data);
  last_step_end_ = Clock::now();
}

Engine::~Engine() = default;

bool Engine::is_gradient_accumulation_boundary() const {
  return (micro_step_ + 1) % gradient_accumulation_steps_ == 0;
}

void Engine::backward(const at::Tensor& loss) {
  StepTimes t;
  t.forward_s = since(last_step_end_);
  last_loss_ = loss.detach().to(at::kDouble).reshape({1});
  auto start = Clock::now();
  zero_->begin_backward(is_gradient_accumulation_boundary());
  // DeepSpeed's scaling: the loss of one micro-batch is 1/gas of the step's loss; fp16 scales up.
  at::Tensor scaled = loss * (scaler_->scale() / double(gradient_accumulation_steps_));
  try {
    scaled.backward();
  } catch (...) {
    // Buckets of this micro-step may be half filled or in flight: start the window again.
    zero_->abort_backward();
    micro_step_ -= micro_step_ % gradient_accumulation_steps_;
    throw;
  }
  at::Tensor on_group = last_loss_.to(parallel_.data().device());
  interval_loss_sum_ = interval_loss_sum_.defined() ? interval_loss_sum_.add_(on_group) : on_group.clone();
  ++interval_losses_;
  t.backward_s = since(start);
  auto wait_start = Clock::now();
  zero_->end_backward();
  t.reduce_s = since(wait_start);
  progress_->add_times(t);
  last_step_end_ = Clock::now();
}

void Engine::record_batch(int64_t samples, int64_t tokens) { progress_->add_samples(samples, tokens); }

void Engine::step() {
  ++micro_step_;
  if (micro_step_ % gradient_accumulation_steps_ == 0) optimizer_step();
  last_step_end_ = Clock::now();
}

double Engine::learning_rate() const { return schedule_->lr_at(global_step_ - skipped_steps_); }

double Engine::loss_scale() const { return scaler_->scale(); }

double Engine::last_loss() const { return last_loss_.defined() ? last_loss_.item<double>() : 0.0; }

void Engine::optimizer_step() {
  auto start = Clock::now();
  const int64_t applied = global_step_ - skipped_steps_;  // the schedule advances on applied steps only
  StepInputs in;
  in.step = applied + 1;
  in.lr = schedule_->lr_at(applied);
  // OneCycle cycles the betas of optimizers that have them (Adam, AdamW, LAMB) and also sets beta2,
  // as DeepSpeed does; SGD has no betas, and DeepSpeed leaves its momentum alone.
  if (config_.optimizer->type != "SGD") {
    in.beta1 = schedule_->momentum_at(applied);
    if (in.beta1) in.beta2 = kOneCycleBeta2;
  }
  // 1. Wait for the gradient reduction; the global norm decides overflow (one host read).
  const double scale = scaler_->scale();
  const double sumsq = zero_->global_grad_sumsq();
  const bool overflow = !std::isfinite(sumsq);
  // 2. One rule for every precision (optim/loss_scaler.h): the scaler decides whether a step whose
  //    gradients are not finite is skipped, and lowers the fp16 scale when it is dynamic.
  auto update = scaler_->update(overflow);
  if (!update.skip_step) {
    // 3. Unscale and clip in one factor (DeepSpeed's rule: clip/(norm + 1e-6) when norm > clip),
    //    then the optimizer on the shards and the parameter allgather.
    last_grad_norm_ = std::sqrt(sumsq) / scale;
    double coef = 1.0 / scale;
    const double clip = config_.gradient_clipping;
    if (clip > 0 && last_grad_norm_ > clip) coef *= clip / (last_grad_norm_ + 1e-6);
    zero_->apply(coef, in);
  } else {
    ++skipped_steps_;
    if (parallel_.rank() == 0) {
      if (scaler_->dynamic() && update.new_scale != update.old_scale)
        std::printf("[tessera] step %lld: gradient overflow, step skipped; loss scale %g -> %g\n",
                    (long long)global_step_ + 1, update.old_scale, update.new_scale);
      else if (scaler_->dynamic())
        std::printf("[tessera] step %lld: gradient overflow, step skipped; loss scale kept at %g (hysteresis)\n",
                    (long long)global_step_ + 1, update.old_scale);
      else
        std::printf("[tessera] step %lld: non-finite gradients, step skipped\n", (long long)global_step_ + 1);
      std::fflush(stdout);
    }
  }
  zero_->zero_grad();
  ++global_step_;
  StepTimes t;
  t.optimizer_s = since(start);
  progress_->add_times(t);
  if (progress_->due(global_step_)) {
    // All ranks join the average of the interval's loss; rank 0 prints. The one host read of the
    // losses happens here, every steps_per_print steps.
    at::Tensor mean = interval_losses_ ? interval_loss_sum_ / double(interval_losses_)
                                       : at::zeros({1}, parallel_.data().options(at::kDouble));
    if (parallel_.data().size() > 1) parallel_.data().all_reduce(mean, ReduceOp::Avg);
    interval_loss_sum_ = at::Tensor();
    interval_losses_ = 0;
    std::string line = progress_->line(global_step_, mean.item<double>(), learning_rate(), scaler_->scale(),
                                       last_grad_norm_);
    if (progress_->printer()) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
  }
}

void Engine::zero_grad() { zero_->zero_grad(); }

MemoryReport Engine::memory() const { return zero_->memory(); }

}  // namespace tessera
