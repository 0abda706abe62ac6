#include "optim/onebit.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "parallel/communicator.h"
#include "parallel/compressed_allreduce.h"

namespace tessera {

namespace {

using NamedState = std::vector<std::pair<std::string, at::Tensor>>;

at::Tensor scaled_gradient(const ShardSegment& s, const StepInputs& in) {
  return s.grads.to(at::kFloat) * in.grad_scale;  // bf16 gradients computed in fp32
}

double correction(bool enabled, double beta, int64_t steps) { return enabled ? 1 - std::pow(beta, double(steps)) : 1.0; }

// What the three share: the parameters' scale blocks, the compressed average over the data group
// and its error buffers, and the phase of the last step.
class OneBitOptimizer : public FlatOptimizer {
 public:
  OneBitOptimizer(const OptimizerHyperparams& p, int64_t n, const at::TensorOptions& o, OptimizerContext ctx)
      : p_(p), options_(o), ctx_(std::move(ctx)) {
    // One scale per parameter piece of the shard (compressed_allreduce's blocks).
    block_starts_.push_back(0);
    for (const ShardPiece& piece : ctx_.pieces)
      if (piece.numel > 0 && piece.local_offset > 0 && piece.local_offset < n) block_starts_.push_back(piece.local_offset);
    std::sort(block_starts_.begin(), block_starts_.end());
    block_starts_.erase(std::unique(block_starts_.begin(), block_starts_.end()), block_starts_.end());
    if (ranks() > 1 && n > 0) errors_ = CompressionErrors::zeros(n, *ctx_.data);
  }
  bool elementwise() const override { return false; }  // one collective over the whole shard
  std::string phase() const override { return last_phase_; }
  // The compression errors are this rank's own (DeepSpeed resets them on every load); 0/1 Adam's
  // counters and 1-bit LAMB's per-parameter coefficients are the same on every rank.
  StateLayout state_layout(const std::string& name) const override {
    if (name == "worker_error" || name == "server_error") return StateLayout::RankLocal;
    if (name == "counters") return StateLayout::Group;
    if (name == "lamb_coeff_freeze" || name == "last_factor") return StateLayout::PerParameter;
    return StateLayout::Shard;
  }
  int64_t state_bytes() const override {
    int64_t bytes = 0;
    for (const auto& [name, t] : named_state()) bytes += t.nbytes();
    return bytes;
  }

 protected:
  int ranks() const { return ctx_.data ? ctx_.data->size() : 1; }
  // `whole` (the shard's n elements) ← its average over the data group, 1-bit compressed with
  // error feedback; unchanged on one rank.
  void compressed_average(at::Tensor& whole) {
    if (ranks() > 1) compressed_allreduce(whole, errors_, *ctx_.data, block_starts_);
  }
  NamedState error_state() const {
    if (!errors_.worker.defined()) return {};
    return {{"worker_error", errors_.worker}, {"server_error", errors_.server}};
  }
  void reset_errors() {
    if (errors_.worker.defined()) errors_.worker.zero_(), errors_.server.zero_();
  }
  // The part of a shard-long state tensor that lines up with segment s.
  static at::Tensor part(const at::Tensor& t, const ShardSegment& s) { return t.narrow(0, s.local_offset, s.params.numel()); }

  OptimizerHyperparams p_;
  at::TensorOptions options_;
  OptimizerContext ctx_;
  std::vector<int64_t> block_starts_;
  CompressionErrors errors_;
  std::string last_phase_ = "warm-up";
};

// p ← p − lr · (m / bc1) / (√(v / bc2) + ε), with AdamW's decoupled decay first (Adam's L2 decay
// was added to the gradient before the momentum). On fp32 CPU shards one pass over p, m, v whose
// every operation is the ATen path's, in its order (ATen divides by a scalar as a multiplication by
// its float reciprocal; its addcdiv multiplies by the value before dividing).
void adam_update(const OptimizerHyperparams& p, const StepInputs& in, const ShardSegment& s, const at::Tensor& m,
                 const at::Tensor& v, double bc1, double bc2) {
  const bool decay = p.adam_w_mode && in.weight_decay != 0;
  auto cpu_fp32 = [](const at::Tensor& t) { return t.is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(); };
  if (cpu_fp32(s.params) && cpu_fp32(m) && cpu_fp32(v)) {
    float* ps = s.params.data_ptr<float>();
    const float* ms = m.data_ptr<float>();
    const float* vs = v.data_ptr<float>();
    const float inverse_root_bc2 = 1.0f / static_cast<float>(std::sqrt(bc2)), eps = static_cast<float>(p.eps);
    const float keep = static_cast<float>(1 - in.lr * in.weight_decay), step = static_cast<float>(-in.lr / bc1);
    for (int64_t i = 0, n = s.params.numel(); i < n; ++i) {
      const float denom = std::sqrt(vs[i]) * inverse_root_bc2 + eps;
      float value = decay ? ps[i] * keep : ps[i];
      ps[i] = value + step * ms[i] / denom;
    }
  } else {
    at::Tensor denom = v.sqrt().div_(std::sqrt(bc2)).add_(p.eps);
    if (decay) s.params.mul_(1 - in.lr * in.weight_decay);
    s.params.addcdiv_(m, denom, -in.lr / bc1);
  }
  write_compute_copy(s);
}

at::Tensor gradient_with_l2(const OptimizerHyperparams& p, const StepInputs& in, const ShardSegment& s) {
  // Unclipped fp32 gradients without L2 decay are used as they are (×1 changes no bit).
  if (in.grad_scale == 1.0 && s.grads.scalar_type() == at::kFloat && (p.adam_w_mode || in.weight_decay == 0))
    return s.grads;
  at::Tensor g = scaled_gradient(s, in);
  if (!p.adam_w_mode && in.weight_decay != 0) g.add_(s.params, in.weight_decay);
  return g;
}

// ---- 1-bit Adam ----------------------------------------------------------------------------------

class OneBitAdam final : public OneBitOptimizer {
 public:
  OneBitAdam(const OptimizerHyperparams& p, int64_t n, const at::TensorOptions& o, OptimizerContext ctx)
      : OneBitOptimizer(p, n, o, std::move(ctx)), adam_(make_flat_optimizer("Adam", p, n, o)) {
    const NamedState state = adam_->named_state();
    exp_avg_ = state.at(0).second, exp_avg_sq_ = state.at(1).second;
  }

  void step(const StepInputs& in, const std::vector<ShardSegment>& segments) override {
    if (wants_averaged_gradients(in.step)) {  // warm-up: Adam itself, on averaged gradients
      last_phase_ = "warm-up";
      adam_->step(in, segments);
      return;
    }
    last_phase_ = "compressed";
    const double beta1 = in.beta1.value_or(p_.betas[0]), beta2 = in.beta2.value_or(p_.betas[1]);
    for (const auto& s : segments) part(exp_avg_, s).mul_(beta1).add_(gradient_with_l2(p_, in, s), 1 - beta1);
    compressed_average(exp_avg_);
    // v stopped at freeze_step, and so did its bias correction.
    const double bc1 = correction(p_.bias_correction, beta1, in.step);
    const double bc2 = correction(p_.bias_correction, beta2, p_.freeze_step);
    for (const auto& s : segments) adam_update(p_, in, s, part(exp_avg_, s), part(exp_avg_sq_, s), bc1, bc2);
  }
  bool wants_averaged_gradients(int64_t step) const override { return step <= p_.freeze_step; }
  NamedState named_state() const override {
    NamedState state = adam_->named_state();
    for (auto& e : error_state()) state.push_back(e);
    return state;
  }
  const char* name() const override { return "OneBitAdam"; }

 private:
  std::unique_ptr<FlatOptimizer> adam_;
  at::Tensor exp_avg_, exp_avg_sq_;
};

// ---- 0/1 Adam ------------------------------------------------------------------------------------

class ZeroOneAdam final : public OneBitOptimizer {
 public:
  ZeroOneAdam(const OptimizerHyperparams& p, int64_t n, const at::TensorOptions& o, OptimizerContext ctx)
      : OneBitOptimizer(p, n, o, std::move(ctx)),
        exp_avg_(at::zeros({n}, o)),
        exp_avg_sq_(at::zeros({n}, o)),
        accumulator_(at::zeros({n}, o)),
        counters_(at::zeros({kCounters}, o.dtype(at::kDouble).device(at::kCPU))) {
    counter(kVarInterval) = 1;
    counter(kLocalStepInterval) = 1;
  }

  void step(const StepInputs& in, const std::vector<ShardSegment>& segments) override {
    const int64_t t = in.step;
    const double beta1 = in.beta1.value_or(p_.betas[0]), beta2 = in.beta2.value_or(p_.betas[1]);
    if (t <= p_.var_freeze_step) {
      if (wants_averaged_gradients(t)) {
        // Averaged in full precision by the engine: both moments.
        last_phase_ = "warm-up";
        for (const auto& s : segments) {
          at::Tensor g = gradient_with_l2(p_, in, s);
          part(exp_avg_sq_, s).mul_(beta2).addcmul_(g, g, 1 - beta2);
          part(exp_avg_, s).mul_(beta1).add_(g, 1 - beta1);
        }
        counter(kVarUpdates) += 1;
        if (++counter(kVarCounter) == double(p_.var_update_scaler)) {
          counter(kVarCounter) = 0;
          counter(kVarInterval) *= 2;
        }
      } else {
        // This rank's own gradient, averaged 1-bit compressed (the accumulator is free until the
        // variance freezes); the momentum only.
        last_phase_ = "compressed";
        for (const auto& s : segments) part(accumulator_, s).copy_(gradient_with_l2(p_, in, s));
        compressed_average(accumulator_);
        for (const auto& s : segments) part(exp_avg_, s).mul_(beta1).add_(part(accumulator_, s), 1 - beta1);
        accumulator_.zero_();
      }
      const double bc1 = correction(p_.bias_correction, beta1, t);
      const double bc2 = correction(p_.bias_correction, beta2, int64_t(counter(kVarUpdates)));
      for (const auto& s : segments) adam_update(p_, in, s, part(exp_avg_, s), part(exp_avg_sq_, s), bc1, bc2);
      // The errors compensated gradients so far; from here they compensate accumulated updates.
      if (t == p_.var_freeze_step) reset_errors();
      return;
    }
    // Variance frozen: a local step, its update also accumulated in u.
    const double bc1 = correction(p_.bias_correction, beta1, t);
    const double bc2 = correction(p_.bias_correction, beta2, int64_t(counter(kVarUpdates)));
    counter(kLearningRates) += in.lr;
    std::vector<at::Tensor> denoms;  // bc1 · (√v̂ + ε): the update's divisor, per segment
    for (const auto& s : segments) {
      at::Tensor m = part(exp_avg_, s);
      m.mul_(beta1).add_(gradient_with_l2(p_, in, s), 1 - beta1);
      at::Tensor denom = part(exp_avg_sq_, s).sqrt().div_(std::sqrt(bc2)).add_(p_.eps).mul_(bc1);
      at::Tensor update = m / denom;
      if (p_.adam_w_mode && in.weight_decay != 0) update.add_(s.params, in.weight_decay);
      s.params.add_(update, -in.lr);
      part(accumulator_, s).add_(update, -in.lr);
      denoms.push_back(std::move(denom));
    }
    const bool sync = t % int64_t(counter(kLocalStepInterval)) == 0;
    last_phase_ = sync ? "compressed" : "local";
    if (sync) {
      // Undo the local steps, average them (in momentum units) compressed, apply the average;
      // the momentum becomes the learning-rate-weighted average of the interval's momenta.
      for (size_t i = 0; i < segments.size(); ++i) {
        segments[i].params.sub_(part(accumulator_, segments[i]));
        part(accumulator_, segments[i]).mul_(denoms[i]);
      }
      compressed_average(accumulator_);
      for (size_t i = 0; i < segments.size(); ++i) {
        at::Tensor u = part(accumulator_, segments[i]);
        part(exp_avg_, segments[i]).copy_(u).div_(-counter(kLearningRates));
        segments[i].params.add_(u / denoms[i]);
      }
      accumulator_.zero_();
      counter(kLearningRates) = 0;
    }
    for (const auto& s : segments) write_compute_copy(s);
    if (++counter(kLocalStepCounter) == double(p_.local_step_scaler)) {
      counter(kLocalStepCounter) = 0;
      counter(kLocalStepInterval) = std::min(double(p_.local_step_clipper), 2 * counter(kLocalStepInterval));
    }
  }
  bool wants_averaged_gradients(int64_t step) const override {
    return step <= p_.var_freeze_step && step % int64_t(counter(kVarInterval)) == 0;
  }
  NamedState named_state() const override {
    NamedState state{{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}, {"momentum_accumulator", accumulator_},
                     {"counters", counters_}};
    for (auto& e : error_state()) state.push_back(e);
    return state;
  }
  const char* name() const override { return "ZeroOneAdam"; }

 private:
  // counters_: the schedule's state, a tensor so a checkpoint saves it with the rest.
  enum Counter { kVarInterval, kVarCounter, kVarUpdates, kLocalStepInterval, kLocalStepCounter, kLearningRates, kCounters };
  double& counter(Counter c) const { return counters_.data_ptr<double>()[c]; }

  at::Tensor exp_avg_, exp_avg_sq_, accumulator_, counters_;
};

// ---- 1-bit LAMB ----------------------------------------------------------------------------------

class OneBitLamb final : public OneBitOptimizer {
 public:
  OneBitLamb(const OptimizerHyperparams& p, int64_t n, const at::TensorOptions& o, OptimizerContext ctx)
      : OneBitOptimizer(p, n, o, ctx),
        exp_avg_sq_fresh_(at::zeros({n}, o)),
        trust_average_(at::zeros({ctx.num_params}, o.dtype(at::kDouble))),
        last_factor_(at::ones({ctx.num_params}, o.dtype(at::kDouble))) {
    // The warm-up is LAMB itself; it reports each step's trust ratios, averaged here (a ratio of
    // exactly 1, LAMB's value for a zero norm, is left out as DeepSpeed does).
    ctx.on_trust_ratios = [this](const at::Tensor& trust) {
      at::Tensor mixed = trust_average_ * p_.coeff_beta + trust.to(at::kDouble) * (1 - p_.coeff_beta);
      trust_average_.copy_(at::where(trust != 1.0, mixed, trust_average_));
    };
    lamb_ = make_flat_optimizer("Lamb", p, n, o, std::move(ctx));
    const NamedState state = lamb_->named_state();
    exp_avg_ = state.at(0).second, exp_avg_sq_ = state.at(1).second;
  }

  void step(const StepInputs& in, const std::vector<ShardSegment>& segments) override {
    if (wants_averaged_gradients(in.step)) {
      last_phase_ = "warm-up";
      lamb_->step(in, segments);
      if (in.step == p_.freeze_step) exp_avg_sq_fresh_.copy_(exp_avg_sq_);
      return;
    }
    last_phase_ = "compressed";
    const double beta1 = in.beta1.value_or(p_.betas[0]), beta2 = in.beta2.value_or(p_.betas[1]);
    const at::Tensor previous = exp_avg_.clone();
    for (const auto& s : segments) part(exp_avg_, s).mul_(beta1).add_(scaled_gradient(s, in), 1 - beta1);
    compressed_average(exp_avg_);
    // The averaged gradient, recovered from the averaged momentum, keeps a fresh variance.
    at::Tensor recovered = (exp_avg_ - previous * beta1).div_(1 - beta1);
    exp_avg_sq_fresh_.mul_(beta2).addcmul_(recovered, recovered, 1 - beta2);

    const double bc1 = correction(p_.bias_correction, beta1, in.step);
    const double bc2 = correction(p_.bias_correction, beta2, p_.freeze_step);
    const double bc2_fresh = correction(p_.bias_correction, beta2, in.step);
    const int P = ctx_.num_params;
    const auto f64 = options_.dtype(at::kDouble);
    // Per parameter: the largest ratio of the frozen to the fresh denominator, ‖u₀‖² and ‖u‖²
    // (u₀ = m̂/denominator, u = u₀ + λ·p).
    std::vector<at::Tensor> updates, ratio_max, prelim_sq, update_sq;
    std::vector<int64_t> index;
    for_each_piece(segments, [&](const ShardPiece& piece, const at::Tensor& params) {
      at::Tensor m = exp_avg_.narrow(0, piece.local_offset, piece.numel);
      at::Tensor denom = exp_avg_sq_.narrow(0, piece.local_offset, piece.numel).div(bc2).sqrt_().add_(p_.eps);
      at::Tensor fresh = exp_avg_sq_fresh_.narrow(0, piece.local_offset, piece.numel).div(bc2_fresh).sqrt_().add_(p_.eps);
      ratio_max.push_back((denom / fresh).max());
      at::Tensor update = (m / bc1).div_(denom);
      prelim_sq.push_back(update.square().sum());
      if (in.weight_decay != 0) update.add_(params, in.weight_decay);
      update_sq.push_back(update.square().sum());
      updates.push_back(update);
      index.push_back(piece.param);
    });
    at::Tensor factor = at::zeros({P}, f64), sums = at::zeros({2, P}, f64);
    if (!index.empty()) {
      at::Tensor idx = at::tensor(index, at::TensorOptions().dtype(at::kLong)).to(options_.device());
      factor.scatter_reduce_(0, idx, at::stack(ratio_max).to(at::kDouble), "amax");
      sums.select(0, 0).index_add_(0, idx, at::stack(prelim_sq).to(at::kDouble));
      sums.select(0, 1).index_add_(0, idx, at::stack(update_sq).to(at::kDouble));
    }
    if (ctx_.max_across_ranks) ctx_.max_across_ranks(factor);
    if (ctx_.sum_across_ranks) ctx_.sum_across_ranks(sums);
    if (in.weight_decay != 0) {
      // Weight decay's share of the step does not depend on the variance: it dilutes the factor.
      at::Tensor norms = sums.sqrt();
      at::Tensor share = at::where(norms.select(0, 1) > 0, norms.select(0, 0) / norms.select(0, 1), at::ones({P}, f64))
                             .clamp_max_(1.0);
      factor = factor * share + (1 - share);
    }
    factor.clamp_(p_.factor_min, p_.factor_max);
    factor = at::minimum(at::maximum(factor, last_factor_ * (1 - p_.factor_threshold)),
                         last_factor_ * (1 + p_.factor_threshold));
    last_factor_.copy_(factor);
    const at::Tensor step_size = (trust_average_ * factor).mul_(-in.lr).to(at::kFloat);
    size_t k = 0;
    for_each_piece(segments, [&](const ShardPiece& piece, const at::Tensor& params) {
      params.addcmul_(updates[k++], step_size.select(0, piece.param));
    });
    for (const auto& s : segments) write_compute_copy(s);
  }
  bool wants_averaged_gradients(int64_t step) const override { return step <= p_.freeze_step; }
  NamedState named_state() const override {
    NamedState state = lamb_->named_state();
    state.emplace_back("exp_avg_sq_fresh", exp_avg_sq_fresh_);
    state.emplace_back("lamb_coeff_freeze", trust_average_);
    state.emplace_back("last_factor", last_factor_);
    for (auto& e : error_state()) state.push_back(e);
    return state;
  }
  const char* name() const override { return "OneBitLamb"; }

 private:
  // f(piece, the piece's parameters) for each parameter piece inside the segments.
  template <class F>
  void for_each_piece(const std::vector<ShardSegment>& segments, F f) const {
    for (const auto& piece : ctx_.pieces) {
      for (const auto& s : segments) {
        const int64_t begin = piece.local_offset - s.local_offset;
        if (begin < 0 || begin + piece.numel > s.params.numel()) continue;
        f(piece, s.params.narrow(0, begin, piece.numel));
        break;
      }
    }
  }

  std::unique_ptr<FlatOptimizer> lamb_;
  at::Tensor exp_avg_, exp_avg_sq_, exp_avg_sq_fresh_;
  at::Tensor trust_average_, last_factor_;  // per parameter, fp64
};

}  // namespace

std::unique_ptr<FlatOptimizer> make_onebit_optimizer(const std::string& type, const OptimizerHyperparams& params,
                                                     int64_t shard_numel, const at::TensorOptions& options,
                                                     OptimizerContext context) {
  if (type == "OneBitAdam") return std::make_unique<OneBitAdam>(params, shard_numel, options, std::move(context));
  if (type == "ZeroOneAdam") return std::make_unique<ZeroOneAdam>(params, shard_numel, options, std::move(context));
  if (type == "OneBitLamb") return std::make_unique<OneBitLamb>(params, shard_numel, options, std::move(context));
  throw std::invalid_argument("tessera: " + type + " is not a 1-bit optimizer (OneBitAdam, ZeroOneAdam, OneBitLamb)");
}

}  // namespace tessera
