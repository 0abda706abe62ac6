// What optim/ needs from the training config, as plain data: the engine's config structs
// (engine/config/config.h) derive from these and add only their JSON key lists, so a default is
// written once, here, and optim/ includes nothing above it. Defaults are DeepSpeed's
// (runtime/constants.py, runtime/fp16/loss_scaler.py, runtime/lr_schedules.py).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tessera {

// Hyper-parameters of the flat optimizers (optim/flat_optimizer.h); which apply depends on the type.
struct OptimizerHyperparams {
  double lr = 1e-3;
  std::vector<double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool bias_correction = true;
  bool adam_w_mode = true;  // DeepSpeed's default: "Adam" applies decoupled (AdamW) decay
  bool torch_adam = false;
  double momentum = 0.0;    // SGD
  double dampening = 0.0;   // SGD
  bool nesterov = false;    // SGD
  double max_coeff = 10.0;  // Lamb trust-ratio clamp
  double min_coeff = 0.01;  // Lamb
  // The 1-bit family (optim/onebit.h), DeepSpeed's names and defaults (runtime/fp16/onebit/).
  int64_t freeze_step = 100000;       // OneBitAdam, OneBitLamb: full-precision warm-up steps
  int64_t var_freeze_step = 100000;   // ZeroOneAdam: the last step that may update the variance
  int64_t var_update_scaler = 16;     // ZeroOneAdam: variance updates before their interval doubles
  int64_t local_step_scaler = 32678;  // ZeroOneAdam: steps before the local-step interval doubles
  int64_t local_step_clipper = 16;    // ZeroOneAdam: the longest local-step interval
  double coeff_beta = 0.9;            // OneBitLamb: the warm-up's moving average of trust ratios
  double factor_max = 4.0;            // OneBitLamb: bounds of the compressed phase's variance factor
  double factor_min = 0.5;
  double factor_threshold = 0.1;      // OneBitLamb: its largest relative change per step
};

// Loss scaling (optim/loss_scaler.h): DeepSpeed's "fp16" section.
struct LossScaleParams {
  bool enabled = false;
  double loss_scale = 0.0;  // 0 means dynamic loss scaling
  int initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
};

// Learning-rate schedules (optim/lr_schedule.h), by schedule type.
struct LrScheduleParams {
  // WarmupLR, WarmupDecayLR
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 1e-3;
  int64_t warmup_num_steps = 1000;
  std::string warmup_type = "log";
  std::optional<int64_t> total_num_steps;  // WarmupDecayLR, WarmupCosineLR (required)
  // WarmupCosineLR
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 1e-4;
  // OneCycle
  std::optional<double> cycle_min_lr;  // required
  std::optional<double> cycle_max_lr;  // required
  double decay_lr_rate = 0.0;
  int64_t cycle_first_step_size = 2000;
  std::optional<int64_t> cycle_second_step_size;  // defaults to cycle_first_step_size
  int64_t cycle_first_stair_count = 0;
  std::optional<int64_t> cycle_second_stair_count;  // defaults to cycle_first_stair_count
  int64_t decay_step_size = 0;
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;
};

}  // namespace tessera
