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
#include <vector>

#include "optim/options.h"
#include "optim/shard.h"

namespace tessera {

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
};

// What LAMB needs to take norms over whole parameters that straddle ranks.
struct LambContext {
  std::vector<ShardPiece> pieces;  // this rank's pieces of each parameter, in local order
  int num_params = 0;
  std::function<void(at::Tensor&)> sum_across_ranks;  // in place, over the data-parallel group
};

std::unique_ptr<FlatOptimizer> make_flat_optimizer(const std::string& type, const OptimizerHyperparams& params, int64_t shard_numel,
                                                   const at::TensorOptions& state_options, LambContext lamb = {});

}  // namespace tessera
