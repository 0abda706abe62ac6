// DeepSpeed's loss scalers; the rules are spelled out in loss_scaler.h.
#include "optim/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

namespace tessera {

namespace {

std::string number(double v) {
  std::ostringstream out;
  out << v;  // 1, 0.25, 65536, 1.70141e+38
  return out.str();
}

}  // namespace

DynamicLossScaler::DynamicLossScaler(double init_scale, int64_t scale_window, double min_scale, int delayed_shift,
                                     bool consecutive_hysteresis)
    : scale_window_(scale_window),
      min_scale_(min_scale),
      delayed_shift_(delayed_shift),
      consecutive_hysteresis_(consecutive_hysteresis) {
  // The config rules already guarantee these; checked again because a zero window would divide by zero.
  if (!(init_scale > 0.0)) throw std::invalid_argument("loss scaler: initial scale must be positive");
  if (scale_window < 1) throw std::invalid_argument("fp16.loss_scale_window must be >= 1");
  if (!(min_scale > 0.0)) throw std::invalid_argument("fp16.min_loss_scale must be > 0");
  if (delayed_shift < 1) throw std::invalid_argument("fp16.hysteresis must be >= 1");
  state_.scale = init_scale;
  state_.cur_iter = 0;
  state_.last_overflow_iter = -1;
  state_.cur_hysteresis = delayed_shift;
}

UpdateResult DynamicLossScaler::update(bool overflow) {
  State& s = state_;
  const double old_scale = s.scale;
  if (overflow) {
    if (delayed_shift_ == 1 || s.cur_hysteresis == 1) {
      // No hysteresis left: the scale must drop. At the floor it cannot, and DeepSpeed stops the
      // run rather than skip steps forever. Thrown before any state changes.
      if (s.scale == min_scale_) {
        throw LossScaleError(
            "fp16 loss scale is already at its minimum (min_loss_scale = " + number(min_scale_) +
            ") and gradients still overflow (inf/nan) at optimizer step " + std::to_string(s.cur_iter) +
            " (0-based, skipped steps included): training cannot continue, as every further step would be "
            "skipped. DeepSpeed stops here too. (hint: try bf16 (\"bf16\": {\"enabled\": true}), lower the "
            "learning rate, enable gradient_clipping, or check the data for inf/nan; a smaller "
            "fp16.min_loss_scale lets the scale fall further)");
      }
      s.scale = std::max(s.scale / kScaleFactor, min_scale_);
    } else {
      s.cur_hysteresis -= 1;  // absorbed: this overflow spends hysteresis, the scale stays
    }
    s.last_overflow_iter = s.cur_iter;
  } else {
    if (consecutive_hysteresis_) s.cur_hysteresis = delayed_shift_;
    // Clean steps completed before this one since the last overflow (or since the start).
    const int64_t stable_interval = (s.cur_iter - s.last_overflow_iter) - 1;
    if (stable_interval > 0 && stable_interval % scale_window_ == 0) {
      if (!consecutive_hysteresis_) s.cur_hysteresis = delayed_shift_;
      s.scale *= kScaleFactor;
    }
  }
  s.cur_iter += 1;
  // DeepSpeed skips every overflowing step, also those whose overflow only spent hysteresis.
  return {overflow, old_scale, s.scale};
}

std::unique_ptr<LossScaler> make_loss_scaler(const LossScaleParams& fp16, bool bf16_enabled) {
  if (fp16.enabled && bf16_enabled) throw std::invalid_argument("fp16 and bf16 cannot both be enabled");
  if (!fp16.enabled) return std::make_unique<UnitLossScaler>();
  if (fp16.loss_scale > 0.0) return std::make_unique<StaticLossScaler>(fp16.loss_scale);
  // DeepSpeed's dynamic_loss_scale_args: init_scale = 2^initial_scale_power, delayed_shift = hysteresis.
  const double init_scale = std::ldexp(1.0, fp16.initial_scale_power);
  return std::make_unique<DynamicLossScaler>(init_scale, fp16.loss_scale_window, fp16.min_loss_scale,
                                             fp16.hysteresis, fp16.consecutive_hysteresis);
}

}  // namespace tessera
