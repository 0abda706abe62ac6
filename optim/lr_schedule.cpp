// DeepSpeed's learning-rate schedules as pure functions of the applied-step count. The formulas
// and the step mapping are documented in lr_schedule.h; the arithmetic below keeps DeepSpeed's
// order of floating-point operations so the values agree with it to the last bit or nearly.
#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace tessera {

namespace {

constexpr double kPi = 3.14159265358979323846;

void check_step(int64_t step) {
  if (step < 0) throw std::invalid_argument("lr schedule: step must be >= 0, got " + std::to_string(step));
}

// DeepSpeed (>= 0.19.3) rejects a non-positive warmup_num_steps, then uses max(2, n) so that
// ln(W) in the log warmup is never 0.
int64_t warmup_steps(int64_t warmup_num_steps) {
  if (warmup_num_steps <= 0)
    throw std::invalid_argument("scheduler.params.warmup_num_steps must be a positive integer, got " +
                                std::to_string(warmup_num_steps) + " (DeepSpeed rejects it too)");
  return std::max<int64_t>(2, warmup_num_steps);
}

bool is_log_warmup(const std::string& warmup_type) {
  if (warmup_type == "log") return true;
  if (warmup_type == "linear") return false;
  throw std::invalid_argument("scheduler.params.warmup_type must be \"log\" or \"linear\", got \"" + warmup_type + "\"");
}

// The warmup fraction shared by WarmupLR, WarmupDecayLR and WarmupCosineLR, for 0 <= i < W.
double warmup_fraction(int64_t i, int64_t W, bool log_warmup) {
  if (log_warmup) return (1.0 / std::log(static_cast<double>(W))) * std::log(static_cast<double>(i + 1));
  return static_cast<double>(i) / static_cast<double>(W);
}

}  // namespace

// ---- constant ----

double ConstantLr::lr_at(int64_t step) const {
  check_step(step);
  return lr_;
}

// ---- WarmupLR / WarmupDecayLR ----

WarmupLr::WarmupLr(double min_lr, double max_lr, int64_t warmup_num_steps, const std::string& warmup_type,
                   std::optional<int64_t> total_num_steps)
    : min_lr_(min_lr),
      max_lr_(max_lr),
      warmup_steps_(warmup_steps(warmup_num_steps)),
      log_warmup_(is_log_warmup(warmup_type)),
      total_num_steps_(total_num_steps) {}

double WarmupLr::gamma(int64_t i) const {
  if (i < warmup_steps_) return warmup_fraction(i, warmup_steps_, log_warmup_);
  if (!total_num_steps_) return 1.0;  // WarmupLR: hold warmup_max_lr
  // WarmupDecayLR: linear decay to 0 at total_num_steps (note W, not warmup_num_steps, as DeepSpeed).
  const double remaining = static_cast<double>(*total_num_steps_ - i);
  const double span = std::max(1.0, static_cast<double>(*total_num_steps_ - warmup_steps_));
  return std::max(0.0, remaining / span);
}

double WarmupLr::lr_at(int64_t step) const {
  check_step(step);
  const int64_t i = step - 1;  // DeepSpeed's last_batch_iteration
  if (i < 0) return min_lr_;   // the constructor writes warmup_min_lr
  return min_lr_ + (max_lr_ - min_lr_) * gamma(i);
}

// ---- WarmupCosineLR ----

WarmupCosineLr::WarmupCosineLr(double base_lr, int64_t total_num_steps, double warmup_min_ratio,
                               int64_t warmup_num_steps, double cos_min_ratio, const std::string& warmup_type)
    : base_lr_(base_lr),
      total_num_steps_(total_num_steps),
      warmup_min_ratio_(warmup_min_ratio),
      warmup_steps_(warmup_steps(warmup_num_steps)),
      cos_min_ratio_(cos_min_ratio),
      log_warmup_(is_log_warmup(warmup_type)) {}

double WarmupCosineLr::ratio(int64_t i) const {
  if (i < warmup_steps_) {
    const double w = warmup_fraction(i, warmup_steps_, log_warmup_);
    return warmup_min_ratio_ + w * (1.0 - warmup_min_ratio_);
  }
  const double done = static_cast<double>(i - warmup_steps_ + 1);
  const double span = static_cast<double>(std::max<int64_t>(1, total_num_steps_ - warmup_steps_));
  // Clamped so the ratio stays at cos_min_ratio past the end instead of rising again.
  const double progress = std::min(1.0, done / span);
  const double cosine = (1.0 + std::cos(kPi * progress)) / 2.0;
  return std::max(0.0, cos_min_ratio_ + (1.0 - cos_min_ratio_) * cosine);
}

double WarmupCosineLr::lr_at(int64_t step) const {
  check_step(step);
  const int64_t i = step - 1;  // DeepSpeed's last_batch_iteration
  if (i < 0) return 0.0;       // the constructor writes lr 0 (get_lr before the first step())
  return base_lr_ * ratio(i);
}

// ---- OneCycle ----

OneCycleLr::OneCycleLr(const LrScheduleParams& p) {
  if (!p.cycle_min_lr || !p.cycle_max_lr)
    throw std::invalid_argument("OneCycle needs scheduler.params.cycle_min_lr and cycle_max_lr");
  if (p.cycle_first_step_size <= 0)
    throw std::invalid_argument("scheduler.params.cycle_first_step_size must be positive, got " +
                                std::to_string(p.cycle_first_step_size));
  if (p.cycle_second_step_size && *p.cycle_second_step_size < 0)
    throw std::invalid_argument("scheduler.params.cycle_second_step_size must be non-negative, got " +
                                std::to_string(*p.cycle_second_step_size));
  min_lr_ = *p.cycle_min_lr;
  max_lr_ = *p.cycle_max_lr;
  first_size_ = static_cast<double>(p.cycle_first_step_size);
  second_size_ = p.cycle_second_step_size ? static_cast<double>(*p.cycle_second_step_size) : first_size_;
  total_size_ = first_size_ + second_size_;
  step_ratio_ = first_size_ / total_size_;
  first_stairs_ = p.cycle_first_stair_count;
  second_stairs_ = p.cycle_second_stair_count.value_or(p.cycle_first_stair_count);
  decay_step_size_ = static_cast<double>(p.decay_step_size);
  decay_lr_rate_ = p.decay_lr_rate;
  cycle_momentum_ = p.cycle_momentum;
  min_mom_ = p.cycle_min_mom;
  max_mom_ = p.cycle_max_mom;
  decay_mom_rate_ = p.decay_mom_rate;
  // A zero decay_step_size turns both decays off; a zero rate turns its own decay off.
  skip_lr_decay_ = p.decay_step_size == 0 || decay_lr_rate_ == 0.0;
  skip_mom_decay_ = p.decay_step_size == 0 || decay_mom_rate_ == 0.0;
}

double OneCycleLr::scale_factor(int64_t batch_iteration) const {
  const double b = static_cast<double>(batch_iteration);
  const double cycle = std::floor(1.0 + b / total_size_);
  const double x = 1.0 + b / total_size_ - cycle;
  double scale;
  int64_t stairs;
  if (x <= step_ratio_) {
    scale = x / step_ratio_;
    stairs = first_stairs_;
  } else {
    scale = (x - 1.0) / (step_ratio_ - 1.0);
    stairs = second_stairs_;
  }
  if (stairs > 0) {
    // Quantized from the integer position in the cycle, not from `scale`, as DeepSpeed does: the
    // float scale can land a hair below an exact stair and floor() would drop a whole stair.
    const double n = static_cast<double>(stairs);
    const double c = std::fmod(b, total_size_);
    const double position = c <= first_size_ ? c * n / first_size_ : (total_size_ - c) * n / second_size_;
    scale = std::floor(position) / n;
  }
  return scale;
}

double OneCycleLr::decay_interval(int64_t step) const {
  // d = last_batch_iteration - total_size + 1 = step - total_size; DeepSpeed divides without flooring.
  const double d = static_cast<double>(step - 1) - total_size_ + 1.0;
  return d / decay_step_size_;
}

double OneCycleLr::lr_at(int64_t step) const {
  check_step(step);
  const int64_t i = step - 1;  // DeepSpeed's last_batch_iteration
  if (i < 0) return min_lr_;   // the constructor writes cycle_min_lr
  if (static_cast<double>(i) < total_size_) return min_lr_ + (max_lr_ - min_lr_) * scale_factor(i + 1);
  if (skip_lr_decay_) return min_lr_;
  return min_lr_ / (1.0 + decay_lr_rate_ * decay_interval(step));
}

std::optional<double> OneCycleLr::momentum_at(int64_t step) const {
  check_step(step);
  if (!cycle_momentum_) return std::nullopt;
  const int64_t i = step - 1;  // DeepSpeed's last_batch_iteration
  if (i < 0) return min_mom_;  // the constructor writes cycle_min_mom (see the header)
  if (static_cast<double>(i) < total_size_) return max_mom_ - (max_mom_ - min_mom_) * scale_factor(i + 1);
  if (skip_mom_decay_) return max_mom_;
  return max_mom_ * (1.0 + decay_mom_rate_ * decay_interval(step));
}

// ---- factory ----

std::unique_ptr<LrSchedule> make_lr_schedule(const std::string& type, const LrScheduleParams& p, double base_lr) {
  if (type.empty()) return std::make_unique<ConstantLr>(base_lr);
  if (type == "WarmupLR")
    return std::make_unique<WarmupLr>(p.warmup_min_lr, p.warmup_max_lr, p.warmup_num_steps, p.warmup_type,
                                      std::nullopt);
  if (type == "WarmupDecayLR" || type == "WarmupCosineLR") {
    if (!p.total_num_steps) throw std::invalid_argument(type + " needs scheduler.params.total_num_steps");
    if (type == "WarmupDecayLR")
      return std::make_unique<WarmupLr>(p.warmup_min_lr, p.warmup_max_lr, p.warmup_num_steps, p.warmup_type,
                                        p.total_num_steps);
    return std::make_unique<WarmupCosineLr>(base_lr, *p.total_num_steps, p.warmup_min_ratio, p.warmup_num_steps,
                                            p.cos_min_ratio, p.warmup_type);
  }
  if (type == "OneCycle") return std::make_unique<OneCycleLr>(p);
  throw std::invalid_argument("unknown scheduler.type \"" + type +
                              "\" (expected WarmupLR, WarmupDecayLR, WarmupCosineLR or OneCycle)");
}

}  // namespace tessera
