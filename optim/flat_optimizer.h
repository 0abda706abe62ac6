// Optimizers over flat fp32 slices: a rank updates only its own shard of each parameter group,
// given as a few contiguous segments (one per bucket), never parameter by parameter.
//
//   Adam / AdamW   Kingma & Ba 2015, Algorithm 1, with torch.optim.Adam's formulas:
//                    m ← β1·m + (1−β1)·g,   v ← β2·v + (1−β2)·g²
//                    p ← p − (lr / (1−β1ᵗ)) · m / (√v / √(1−β2ᵗ) + ε)
//                  weight decay: L2 (g ← g + λ·p, before the moments) or decoupled
//                  (p ← p·(1 − lr·λ), Loshchilov & Hutter 2019) when adam_w_mode.
//   SGD            torch.optim.SGD: g ← g + λ·p; b ← μ·b + (1−τ)·g (b₁ = g); g ← g + μ·b (Nesterov) or b.
//   LAMB           You et al. 2020 (DeepSpeed's FusedLamb): u = m̂ / (√v̂ + ε) + λ·p,
//                  p ← p − lr · clamp(‖p‖/‖u‖, min_coeff, max_coeff) · u, the norms taken over the
//                  WHOLE parameter: partial sums from each rank's pieces are summed across ranks.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "optim/options.h"
#include "optim/shard.h"

namespace tessera {

class Communicator;

struct StepInputs {
  int64_t step = 1;  // 1-based count of applied optimizer steps (Adam's bias correction; SGD starts
                     // its momentum buffer from the gradient at step 1): callers must count it
  double lr = 0;
  double weight_decay = 0;
  double grad_scale = 1;              // gradients are multiplied by this (1/loss scale × clip coefficient)
  std::optional<double> beta1;        // OneCycle's momentum, when it cycles
  std::optional<double> beta2;        // set with it (DeepSpeed's OneCycle)
};

class FlatOptimizer {
 public:
  virtual ~FlatOptimizer() = default;
  virtual void step(const StepInputs& in, const std::vector<ShardSegment>& segments) = 0;
  virtual int64_t state_bytes() const = 0;
  // Whether step() on a subset of the segments equals the part of a step on all of them (Adam,
  // SGD: elementwise); LAMB's trust ratios need every segment at once.
  virtual bool elementwise() const { return true; }
  // Elementwise optimizers keep their state as fp32 arrays laid out like the shard (Adam: m, v;
  // SGD with momentum: the buffer). step_with_state() steps `segments` with those arrays given by
  // the caller instead of its own, each covering shard elements [state_offset, state_offset + n):
  // NVMe offload streams the state through memory a tile at a time (offload/optimizer_swapper.h),
  // and builds the optimizer with no state of its own (shard_numel 0).
  virtual int state_arrays() const { return 0; }
  virtual void step_with_state(const StepInputs& in, const std::vector<ShardSegment>& segments,
                               const std::vector<at::Tensor>& state, int64_t state_offset);
  virtual const char* name() const = 0;

  // The optimizer's state by name (DeepSpeed's: exp_avg, exp_avg_sq, momentum_buffer, and the
  // 1-bit family's error buffers and frozen variance), each a tensor laid out like the shard that
  // this optimizer updates in place: what a checkpoint saves and loads.
  virtual std::vector<std::pair<std::string, at::Tensor>> named_state() const { return {}; }
  // How each named state is laid out, which decides how a checkpoint reshards it:
  enum class StateLayout {
    Shard,         // one element per shard element (the moments): by parameter ranges, any layout
    PerParameter,  // one element per parameter of the group (1-bit LAMB's coefficients): by name
    Group,         // the group's own values, the same on every rank (0/1 Adam's counters)
    Uniform,       // like Group, and the same in every group too (a client torch optimizer's step
                   // count): loads from another group's record when the groups were cut otherwise
    RankLocal,     // this rank's own (the 1-bit family's compression errors): the same layout only
  };
  virtual StateLayout state_layout(const std::string& /*name*/) const { return StateLayout::Shard; }
  // Whether step `step` (the coming StepInputs::step) needs its gradients averaged over the
  // data-parallel group first (the engine's reduction during backward). The 1-bit family
  // (optim/onebit.h) answers false once it communicates its own compressed state instead; the
  // gradients then stay this rank's own. A function of the step and the named state only, so a
  // run resumed from a checkpoint makes the same choice.
  virtual bool wants_averaged_gradients(int64_t step) const { return true; }
  // The phase of the coming step for the progress line ("warm-up", "compressed", ...); empty: none.
  virtual std::string phase() const { return {}; }
  // An optimizer whose state appears at its first step (a script's own torch optimizer,
  // python/csrc/client_optimizer.h) creates it now, without changing the parameters, so that a
  // checkpoint saved after some steps can be loaded into it; the others have theirs already.
  // Returns whether it made state now.
  virtual bool materialize_state() { return false; }
  // A load that failed after materialize_state() made state: the state goes again, so that the
  // first step starts it as it would have.
  virtual void discard_materialized_state() {}
};

// What an optimizer may need beyond its shard: LAMB's norms over whole parameters that straddle
// ranks, and the group the 1-bit family averages its compressed state over.
struct OptimizerContext {
  std::vector<ShardPiece> pieces;  // this rank's pieces of each parameter, in local order
  int num_params = 0;
  // In place on a [.., num_params] tensor of per-parameter partial sums (maxima): over the ranks
  // holding the other pieces or tensor-parallel slices of each parameter; empty: none do.
  std::function<void(at::Tensor&)> sum_across_ranks;
  std::function<void(at::Tensor&)> max_across_ranks;
  // LAMB: called each step with the per-parameter trust ratios it applied (1-bit LAMB's warm-up
  // averages them).
  std::function<void(const at::Tensor&)> on_trust_ratios;
  // The 1-bit family: the data-parallel group its compressed allreduce runs over (null: one rank).
  Communicator* data = nullptr;
};

// Adam, AdamW, SGD, Lamb, and the 1-bit family (OneBitAdam, ZeroOneAdam, OneBitLamb: optim/onebit.h).
std::unique_ptr<FlatOptimizer> make_flat_optimizer(const std::string& type, const OptimizerHyperparams& params, int64_t shard_numel,
                                                   const at::TensorOptions& state_options, OptimizerContext context = {});

// Whether `type` is one of the 1-bit family (they run at ZeRO stage 0 only).
bool is_onebit_optimizer(const std::string& type);

}  // namespace tessera
