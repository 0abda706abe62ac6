// Loss scaling for fp16 training, following DeepSpeed (deepspeed/runtime/fp16/loss_scaler.py,
// as of v0.19.5: the DynamicLossScaler that ZeRO stages 1-3 use).
//
// The loss is multiplied by scale() before backward so small fp16 gradients do not flush to zero;
// the optimizer unscales them. After each optimizer step's backward the engine learns whether any
// rank's gradients hold inf/nan (from the global gradient norm) and calls update(overflow) once.
//
// The one rule, for every precision: the step is skipped exactly when update() says `skip_step`,
// and every scaler says so exactly when the gradients overflowed. A skipped step changes no weight
// and does not advance the lr schedule; the dynamic scaler also lowers the scale, and a long enough
// run of clean steps raises it again.
//
// Which scaler make_loss_scaler() builds:
//   fp16.enabled, fp16.loss_scale == 0  DynamicLossScaler (see below)
//   fp16.enabled, fp16.loss_scale > 0   StaticLossScaler: that scale forever; overflowing steps are
//                                       still skipped, as DeepSpeed does
//   fp16 off (fp32 or bf16)             UnitLossScaler: scale 1, skips non-finite steps. (DeepSpeed
//                                       does not check bf16/fp32 gradients and would apply the NaN,
//                                       ruining every weight; tessera skips the step and says so.)
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>

#include "optim/options.h"

namespace tessera {

// The dynamic loss scale cannot go lower and the gradients still overflow: training cannot go on.
class LossScaleError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct UpdateResult {
  bool skip_step;    // true exactly when the step overflowed (hysteresis-absorbed overflows included)
  double old_scale;  // the scale the step's backward used
  double new_scale;  // the scale for the next step
};

class LossScaler {
 public:
  virtual ~LossScaler() = default;
  virtual double scale() const = 0;
  // Called once per optimizer step with whether any rank's gradients overflowed (inf/nan).
  virtual UpdateResult update(bool overflow) = 0;
  virtual bool dynamic() const = 0;
};

// DeepSpeed's DynamicLossScaler. State: scale, cur_iter (update() calls so far, skipped steps
// included), last_overflow_iter (-1 before any overflow) and cur_hysteresis (starts at
// delayed_shift = fp16.hysteresis). On update(overflow), at iteration cur_iter:
//
//   overflow:
//     if delayed_shift == 1 or cur_hysteresis == 1:      (no hysteresis left)
//       if scale == min_scale: throw LossScaleError
//       scale = max(scale / 2, min_scale)
//     else:
//       cur_hysteresis -= 1                               (absorbed: scale unchanged)
//     last_overflow_iter = cur_iter
//   no overflow:
//     if consecutive_hysteresis: cur_hysteresis = delayed_shift
//     stable = cur_iter - last_overflow_iter - 1          (clean steps before this one since the last overflow)
//     if stable > 0 and stable % scale_window == 0:
//       if not consecutive_hysteresis: cur_hysteresis = delayed_shift
//       scale *= 2
//   cur_iter += 1
//
// So the scale doubles on the (scale_window + 1)-th clean step after an overflow (or after the
// start), then every scale_window clean steps. Hysteresis is refilled only by a doubling, or with
// consecutive_hysteresis by any clean step. Once it is used up, every overflow halves the scale.
//
// Worked example (init 8, scale_window 2, hysteresis 2, consecutive_hysteresis false):
//   update:  clean  clean  clean  ovf   ovf   ovf   clean  clean  clean
//   scale:   8      8      16     16    8     4     4      4      8
//   (the first overflow only spends the hysteresis; every update returns the new scale)
class DynamicLossScaler : public LossScaler {
 public:
  // Everything a checkpoint needs to resume the scaler exactly.
  struct State {
    double scale = 0.0;
    int64_t cur_iter = 0;
    int64_t last_overflow_iter = -1;
    int cur_hysteresis = 1;
  };

  DynamicLossScaler(double init_scale, int64_t scale_window, double min_scale, int delayed_shift,
                    bool consecutive_hysteresis);

  double scale() const override { return state_.scale; }
  UpdateResult update(bool overflow) override;
  bool dynamic() const override { return true; }

  const State& state() const { return state_; }
  void load_state(const State& state) { state_ = state; }

 private:
  static constexpr double kScaleFactor = 2.0;  // DeepSpeed hard-codes it

  int64_t scale_window_;
  double min_scale_;
  int delayed_shift_;
  bool consecutive_hysteresis_;
  State state_;
};

// fp16 with a fixed fp16.loss_scale: the scale never changes; overflowing steps are skipped.
class StaticLossScaler : public LossScaler {
 public:
  explicit StaticLossScaler(double scale) : scale_(scale) {}
  double scale() const override { return scale_; }
  UpdateResult update(bool overflow) override { return {overflow, scale_, scale_}; }
  bool dynamic() const override { return false; }

 private:
  double scale_;
};

// fp32 and bf16: no scaling; a step with non-finite gradients is skipped (the weights stay finite).
class UnitLossScaler : public LossScaler {
 public:
  double scale() const override { return 1.0; }
  UpdateResult update(bool overflow) override { return {overflow, 1.0, 1.0}; }
  bool dynamic() const override { return false; }
};

// The scaler for the config's precision (table at the top). Throws std::invalid_argument when
// fp16 and bf16 are both enabled (the config check already rejects that).
std::unique_ptr<LossScaler> make_loss_scaler(const LossScaleParams& fp16, bool bf16_enabled);

}  // namespace tessera
