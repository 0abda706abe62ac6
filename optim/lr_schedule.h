// Learning-rate schedules with DeepSpeed's formulas (deepspeed/runtime/lr_schedules.py, as of
// v0.19.5): WarmupLR, WarmupDecayLR, WarmupCosineLR and OneCycle, plus a constant lr when the
// config has no scheduler.
//
// Every schedule is a pure function of the optimizer step, with no mutable state, so a
// checkpoint only needs the step count and resuming cannot drift.
//
// How tessera's `step` maps to DeepSpeed's counter
// ------------------------------------------------
// DeepSpeed's scheduler keeps `last_batch_iteration`: -1 after its constructor (which already
// writes an lr into the optimizer), then +1 per `scheduler.step()`. DeepSpeed's engine calls
// `lr_scheduler.step()` after an optimizer step only when that step was applied: an fp16 step
// skipped for overflow does not advance the schedule (engine.py `_take_model_step`). So the lr
// used by the optimizer step that is applied `step`-th (0-based) is DeepSpeed's `get_lr()` at
//
//     last_batch_iteration = step - 1
//
// where -1 means "the value the constructor wrote". `step` therefore counts applied optimizer
// steps only: the engine passes (optimizer steps taken) - (steps skipped for overflow), and a
// skipped step is retried at the same lr. DeepSpeed's checkpoint field `last_batch_iteration`
// equals that count minus one.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "optim/options.h"

namespace tessera {

class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  // The learning rate of applied optimizer step `step` (0-based): DeepSpeed's value after its
  // constructor and `step` calls of scheduler.step(), i.e. at last_batch_iteration = step - 1.
  virtual double lr_at(int64_t step) const = 0;
  // OneCycle with cycle_momentum: the beta1 of that step; nullopt for every other schedule.
  // DeepSpeed writes betas = (beta1, kOneCycleBeta2) whenever it cycles momentum, so an engine
  // that follows it also sets beta2 to kOneCycleBeta2. DeepSpeed turns momentum cycling off for
  // optimizers without betas (SGD); the engine ignores this value for them.
  virtual std::optional<double> momentum_at(int64_t /*step*/) const { return std::nullopt; }
  virtual std::string name() const = 0;
};

// The beta2 DeepSpeed's OneCycle writes next to every cycled beta1 (it replaces the configured one).
constexpr double kOneCycleBeta2 = 0.99;

// No scheduler: every step uses the optimizer's lr.
class ConstantLr : public LrSchedule {
 public:
  explicit ConstantLr(double lr) : lr_(lr) {}
  double lr_at(int64_t step) const override;
  std::string name() const override { return "constant"; }

 private:
  double lr_;
};

// WarmupLR. With W = max(2, warmup_num_steps), i = last_batch_iteration = step - 1:
//   lr(i)    = warmup_min_lr + (warmup_max_lr - warmup_min_lr) * gamma(i)
//   gamma(i) = ln(i + 1) / ln(W)   (warmup_type "log")     for 0 <= i < W
//            = i / W               (warmup_type "linear")  for 0 <= i < W
//            = 1                                           for i >= W
//   lr(-1)   = warmup_min_lr (the constructor's value)
// "linear" reaches warmup_max_lr only at i = W; "log" already at i = W - 1.
// WarmupDecayLR reuses the warmup and replaces gamma for i >= W with
//   gamma(i) = max(0, (total_num_steps - i) / max(1, total_num_steps - W))
// so the lr falls linearly to warmup_min_lr at i = total_num_steps and stays there.
class WarmupLr : public LrSchedule {
 public:
  // total_num_steps: nullopt for WarmupLR, the step count for WarmupDecayLR.
  WarmupLr(double min_lr, double max_lr, int64_t warmup_num_steps, const std::string& warmup_type,
           std::optional<int64_t> total_num_steps);
  double lr_at(int64_t step) const override;
  std::string name() const override { return total_num_steps_ ? "WarmupDecayLR" : "WarmupLR"; }

 private:
  double gamma(int64_t i) const;

  double min_lr_;
  double max_lr_;
  int64_t warmup_steps_;  // W = max(2, warmup_num_steps), as DeepSpeed
  bool log_warmup_;
  std::optional<int64_t> total_num_steps_;
};

// WarmupCosineLR: a ratio of the optimizer's lr (base_lr). With W = max(2, warmup_num_steps),
// T = total_num_steps, i = last_batch_iteration = step - 1:
//   lr(i)  = base_lr * ratio(i)
//   warmup, 0 <= i < W:  w = ln(i + 1) / ln(W) ("log") or i / W ("linear")
//                        ratio = warmup_min_ratio + w * (1 - warmup_min_ratio)
//   cosine, i >= W:      p = min(1, (i - W + 1) / max(1, T - W))
//                        ratio = max(0, cos_min_ratio + (1 - cos_min_ratio) * (1 + cos(pi p)) / 2)
//   lr(-1) = 0: DeepSpeed's constructor writes lr 0, so the very first step does not move the
//   weights (its warmup starts at the second step).
class WarmupCosineLr : public LrSchedule {
 public:
  WarmupCosineLr(double base_lr, int64_t total_num_steps, double warmup_min_ratio, int64_t warmup_num_steps,
                 double cos_min_ratio, const std::string& warmup_type);
  double lr_at(int64_t step) const override;
  std::string name() const override { return "WarmupCosineLR"; }

 private:
  double ratio(int64_t i) const;

  double base_lr_;
  int64_t total_num_steps_;
  double warmup_min_ratio_;
  int64_t warmup_steps_;  // W = max(2, warmup_num_steps)
  double cos_min_ratio_;
  bool log_warmup_;
};

// OneCycle (1cycle policy): one triangle from cycle_min_lr up to cycle_max_lr over
// cycle_first_step_size steps and back down over cycle_second_step_size, then an optional decay.
// Momentum (beta1) moves the opposite way, between cycle_max_mom and cycle_min_mom.
// With F, S the two half sizes, L = F + S, i = last_batch_iteration = step - 1:
//   in the cycle, i < L, with b = i + 1 (= step):
//     x = 1 + b/L - floor(1 + b/L)                     (position in the cycle, in [0, 1))
//     s = x / (F/L)                 if x <= F/L        (rising half)
//       = (x - 1) / (F/L - 1)       otherwise          (falling half)
//     stairs: with n = that half's stair count > 0 and c = b mod L,
//       s = floor(c * n / F) / n    if c <= F,   floor((L - c) * n / S) / n otherwise
//     lr  = cycle_min_lr + (cycle_max_lr - cycle_min_lr) * s
//     mom = cycle_max_mom - (cycle_max_mom - cycle_min_mom) * s
//   after the cycle, i >= L, with d = i - L + 1 (= step - L), k = d / decay_step_size (not floored):
//     lr  = cycle_min_lr / (1 + decay_lr_rate * k)     (cycle_min_lr if decay_lr_rate or decay_step_size is 0)
//     mom = cycle_max_mom * (1 + decay_mom_rate * k)   (cycle_max_mom if decay_mom_rate or decay_step_size is 0)
//   step 0 (the constructor's values): lr = cycle_min_lr and mom = cycle_min_mom. The momentum is
//   DeepSpeed's quirk: the cycle formula would give cycle_max_mom, but its constructor writes
//   cycle_min_mom, so step 0 uses cycle_min_mom and step 1 jumps to near cycle_max_mom.
// The stairs follow DeepSpeed >= 0.19.4 (earlier versions ignored the stair counts).
class OneCycleLr : public LrSchedule {
 public:
  explicit OneCycleLr(const LrScheduleParams& p);
  double lr_at(int64_t step) const override;
  std::optional<double> momentum_at(int64_t step) const override;
  std::string name() const override { return "OneCycle"; }

 private:
  double scale_factor(int64_t batch_iteration) const;  // s above, at b = batch_iteration
  double decay_interval(int64_t step) const;           // k above

  double min_lr_, max_lr_;
  double first_size_, second_size_, total_size_, step_ratio_;
  int64_t first_stairs_, second_stairs_;
  double decay_step_size_;
  double decay_lr_rate_;
  bool cycle_momentum_;
  double min_mom_, max_mom_;
  double decay_mom_rate_;
  bool skip_lr_decay_, skip_mom_decay_;
};

// `base_lr` is optimizer.params.lr (WarmupCosineLR scales it; the others set absolute lrs).
// No scheduler: constant base_lr. Throws std::invalid_argument for parameters DeepSpeed rejects
// (warmup_num_steps <= 0) or a config that skipped validation (a missing required value).
std::unique_ptr<LrSchedule> make_lr_schedule(const std::string& type, const LrScheduleParams& params, double base_lr);

}  // namespace tessera
