// The 1-bit optimizers: after a warm-up they stop averaging gradients and average their own state
// with the error-compensated 1-bit allreduce (parallel/compressed_allreduce.h), ~1 bit per
// parameter per step instead of 32. Each is a FlatOptimizer over a whole shard (ZeRO stage 0:
// every rank holds everything), with DeepSpeed's parameter names and defaults (options.h).
//
//   OneBitAdam   Tang et al. 2021, Algorithm 1. Steps 1..freeze_step: Adam on averaged gradients
//                (the same kernel as "Adam": bit-identical). Then the variance v is frozen and each
//                rank updates its momentum from its own gradient, m ← β1·m + (1−β1)·g, averages m
//                compressed, and steps p ← p − lr·m̂/(√v̂ + ε) with v̂'s bias correction frozen at
//                freeze_step.
//   ZeroOneAdam  Lu et al. 2022 (0/1 Adam), Algorithm 1. Until var_freeze_step the variance is
//                updated only on steps whose gradients are averaged in full precision; their
//                interval doubles after every var_update_scaler such steps, and the steps between
//                average a 1-bit compressed gradient instead. After var_freeze_step each rank takes
//                local steps and accumulates them in u; every local_step_interval steps (doubling
//                every local_step_scaler steps up to local_step_clipper) the ranks undo their local
//                steps, average u·(√v̂ + ε) compressed and apply the average; steps in between send
//                nothing.
//   OneBitLamb   Li et al. 2021, Algorithm 1. Steps 1..freeze_step: LAMB (the "Lamb" code), while
//                an average of each parameter's trust ratio is kept (coeff_beta). Then v is frozen,
//                m is averaged compressed, a fresh variance is kept from the gradients recovered
//                from the averaged momentum, g = (m − β1·m_prev)/(1 − β1), and each parameter's
//                step is lr · trust_avg · factor · u, factor = max(√v̂/√v̂_fresh) clamped to
//                [factor_min, factor_max] and to ±factor_threshold of the last one.
//
// Differences from DeepSpeed, on purpose: bias_correction is honoured (DeepSpeed's 1-bit
// optimizers accept it and ignore it; set it false for their exact steps); the state is averaged in
// one collective per parameter group with a scale per parameter (DeepSpeed: one collective per
// tensor; its 1-bit LAMB's fixed per-tensor scaling coefficients are then redundant); the gradient
// norm used for clipping after the freeze is the RMS over ranks of each rank's local norm (DeepSpeed:
// each rank clips by its own).
#pragma once

#include <memory>
#include <string>

#include "optim/flat_optimizer.h"

namespace tessera {

// type: OneBitAdam, ZeroOneAdam or OneBitLamb. `context.data`: the group the state is averaged over.
std::unique_ptr<FlatOptimizer> make_onebit_optimizer(const std::string& type, const OptimizerHyperparams& params,
                                                     int64_t shard_numel, const at::TensorOptions& state_options,
                                                     OptimizerContext context);

}  // namespace tessera
