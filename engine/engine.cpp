#include "engine/engine.h"

#include <ATen/ops/full.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>

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
  if (grid.tensor > 1 || grid.pipe > 1)
    throw std::invalid_argument("tessera: tensor and pipeline parallelism are not implemented in the engine yet");
  if (config_.optimizer && config_.optimizer->type == "OneBitAdam")
    throw std::invalid_argument("tessera: OneBitAdam is not implemented in the engine yet");
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
  last_loss_ = loss.detach().item<double>();
  progress_->add_loss(last_loss_);
  auto start = Clock::now();
  zero_->begin_backward(is_gradient_accumulation_boundary());
  // DeepSpeed's scaling: the loss of one micro-batch is 1/gas of the step's loss; fp16 scales up.
  at::Tensor scaled = loss * (scaler_->scale() / double(gradient_accumulation_steps_));
  scaled.backward();
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

void Engine::optimizer_step() {
  auto start = Clock::now();
  const int64_t applied = global_step_ - skipped_steps_;  // the schedule advances on applied steps only
  StepInputs in;
  in.step = applied + 1;
  in.lr = schedule_->lr_at(applied);
  in.beta1 = schedule_->momentum_at(applied);
  if (in.beta1) in.beta2 = kOneCycleBeta2;  // DeepSpeed's OneCycle also sets Adam's beta2 when it cycles momentum
  const double scale = scaler_->scale();
  ZeroStepResult r = zero_->step(scale, config_.gradient_clipping, in);
  auto update = scaler_->update(r.overflow);
  if (r.overflow) {
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
  } else {
    last_grad_norm_ = r.grad_norm;
  }
  zero_->zero_grad();
  ++global_step_;
  StepTimes t;
  t.optimizer_s = since(start);
  progress_->add_times(t);
  if (progress_->due(global_step_)) {
    // All ranks join the average of the interval's loss; rank 0 prints.
    at::Tensor mean = at::full({1}, progress_->interval_mean_loss(), at::kDouble);
    if (parallel_.data().size() > 1) parallel_.data().all_reduce(mean, ReduceOp::Avg);
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
