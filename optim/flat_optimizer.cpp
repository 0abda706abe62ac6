#include "optim/flat_optimizer.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/where.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/zeros.h>

#include <cmath>
#include <stdexcept>

#include "csrc/cpu_adam.h"
#include "optim/device_adam.h"
#include "optim/onebit.h"

namespace tessera {

namespace {

// The SIMD CPU kernel applies to fp32 CPU tensors in one contiguous run (csrc/cpu_adam.h), with
// fp32 or bf16 gradients (data_types.grad_accum_dtype).
bool cpu_kernel_applies(const ShardSegment& s) {
  auto fp32_cpu = [](const at::Tensor& t) { return t.is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(); };
  const bool grads_ok = s.grads.is_cpu() && s.grads.is_contiguous() &&
                        (s.grads.scalar_type() == at::kFloat || s.grads.scalar_type() == at::kBFloat16);
  if (!fp32_cpu(s.params) || !grads_ok) return false;
  if (!s.compute_copy.defined()) return true;
  const auto t = s.compute_copy.scalar_type();
  return s.compute_copy.is_cpu() && s.compute_copy.is_contiguous() && (t == at::kBFloat16 || t == at::kHalf);
}

class Adam final : public FlatOptimizer {
 public:
  Adam(const OptimizerHyperparams& p, int64_t n, const at::TensorOptions& o)
      : p_(p), exp_avg_(at::zeros({n}, o)), exp_avg_sq_(at::zeros({n}, o)) {}

  void step(const StepInputs& in, const std::vector<ShardSegment>& segments) override {
    const double beta1 = in.beta1.value_or(p_.betas[0]), beta2 = in.beta2.value_or(p_.betas[1]);
    if (device_adam_applies(segments, exp_avg_, p_.bias_correction)) {
      DeviceAdamStep k;
      k.lr = in.lr, k.beta1 = beta1, k.beta2 = beta2, k.eps = p_.eps, k.weight_decay = in.weight_decay;
      k.adam_w_mode = p_.adam_w_mode, k.step = in.step, k.grad_scale = in.grad_scale;
      device_adam_step(k, segments, exp_avg_, exp_avg_sq_, step_count_, inverse_grad_scale_);
      return;
    }
    step_with_state(in, segments, {exp_avg_, exp_avg_sq_}, 0);
  }

  int state_arrays() const override { return 2; }
  void step_with_state(const StepInputs& in, const std::vector<ShardSegment>& segments,
                       const std::vector<at::Tensor>& state, int64_t state_offset) override {
    const double beta1 = in.beta1.value_or(p_.betas[0]), beta2 = in.beta2.value_or(p_.betas[1]);
    const double bc1 = p_.bias_correction ? 1 - std::pow(beta1, double(in.step)) : 1.0;
    const double bc2 = p_.bias_correction ? 1 - std::pow(beta2, double(in.step)) : 1.0;
    for (const auto& s : segments) {
      const int64_t n = s.params.numel();
      at::Tensor m = state.at(0).narrow(0, s.local_offset - state_offset, n);
      at::Tensor v = state.at(1).narrow(0, s.local_offset - state_offset, n);
      if (cpu_kernel_applies(s)) {
        AdamParams k;
        k.lr = float(in.lr), k.beta1 = float(beta1), k.beta2 = float(beta2), k.eps = float(p_.eps);
        k.weight_decay = float(in.weight_decay), k.adamw_mode = p_.adam_w_mode;
        k.bias_correction = p_.bias_correction, k.step = in.step, k.grad_scale = float(in.grad_scale);
        void* copy = s.compute_copy.defined() ? s.compute_copy.data_ptr() : nullptr;
        HalfType copy_type = s.compute_copy.defined() && s.compute_copy.scalar_type() == at::kHalf
                                 ? HalfType::Float16 : HalfType::BFloat16;
        cpu_adam_step(k, s.params.data_ptr<float>(), s.grads.data_ptr(),
                      s.grads.scalar_type() == at::kBFloat16 ? GradType::BFloat16 : GradType::Float32,
                      m.data_ptr<float>(), v.data_ptr<float>(), n, copy, copy_type);
        continue;
      }
      // Any other device or layout: the same formulas with ATen operations.
      at::Tensor g = s.grads.to(at::kFloat) * in.grad_scale;  // bf16 gradients computed in fp32
      if (!p_.adam_w_mode && in.weight_decay != 0) g.add_(s.params, in.weight_decay);
      m.mul_(beta1).add_(g, 1 - beta1);
      v.mul_(beta2).addcmul_(g, g, 1 - beta2);
      at::Tensor denom = v.sqrt().div_(std::sqrt(bc2)).add_(p_.eps);
      if (p_.adam_w_mode && in.weight_decay != 0) s.params.mul_(1 - in.lr * in.weight_decay);
      s.params.addcdiv_(m, denom, -in.lr / bc1);
      write_compute_copy(s);
    }
  }
  int64_t state_bytes() const override { return exp_avg_.nbytes() + exp_avg_sq_.nbytes(); }
  const char* name() const override { return p_.adam_w_mode ? "AdamW" : "Adam"; }
  std::vector<std::pair<std::string, at::Tensor>> named_state() const override {
    return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
  }

 private:
  OptimizerHyperparams p_;
  at::Tensor exp_avg_, exp_avg_sq_;
  at::Tensor step_count_, inverse_grad_scale_;  // the fused GPU kernel's scalar inputs, on the device
};

class Sgd final : public FlatOptimizer {
 public:
  Sgd(const OptimizerHyperparams& p, int64_t n, const at::TensorOptions& o) : p_(p) {
    if (p_.momentum != 0) momentum_buffer_ = at::zeros({n}, o);
  }
  void step(const StepInputs& in, const std::vector<ShardSegment>& segments) override {
    step_with_state(in, segments, momentum_buffer_.defined() ? std::vector<at::Tensor>{momentum_buffer_}
                                                             : std::vector<at::Tensor>{}, 0);
  }
  int state_arrays() const override { return p_.momentum != 0 ? 1 : 0; }
  void step_with_state(const StepInputs& in, const std::vector<ShardSegment>& segments,
                       const std::vector<at::Tensor>& state, int64_t state_offset) override {
    const double mu = in.beta1.value_or(p_.momentum);
    for (const auto& s : segments) {
      at::Tensor d = s.grads.to(at::kFloat) * in.grad_scale;
      if (in.weight_decay != 0) d.add_(s.params, in.weight_decay);
      if (p_.momentum != 0) {
        at::Tensor b = state.at(0).narrow(0, s.local_offset - state_offset, s.params.numel());
        // torch: the first buffer is the gradient itself. `step` counts applied steps, so this is
        // the buffer's first step however the state is held (a flag here would flip after one tile).
        if (in.step <= 1) b.copy_(d);
        else b.mul_(mu).add_(d, 1 - p_.dampening);
        if (p_.nesterov) d.add_(b, mu);
        else d = b;
      }
      s.params.add_(d, -in.lr);
      write_compute_copy(s);
    }
  }
  int64_t state_bytes() const override { return momentum_buffer_.defined() ? momentum_buffer_.nbytes() : 0; }
  const char* name() const override { return "SGD"; }
  std::vector<std::pair<std::string, at::Tensor>> named_state() const override {
    if (!momentum_buffer_.defined()) return {};
    return {{"momentum_buffer", momentum_buffer_}};
  }

 private:
  OptimizerHyperparams p_;
  at::Tensor momentum_buffer_;
};

class Lamb final : public FlatOptimizer {
 public:
  Lamb(const OptimizerHyperparams& p, int64_t n, const at::TensorOptions& o, OptimizerContext ctx)
      : p_(p), exp_avg_(at::zeros({n}, o)), exp_avg_sq_(at::zeros({n}, o)), ctx_(std::move(ctx)) {}

  void step(const StepInputs& in, const std::vector<ShardSegment>& segments) override {
    const double beta1 = in.beta1.value_or(p_.betas[0]), beta2 = in.beta2.value_or(p_.betas[1]);
    const double bc1 = p_.bias_correction ? 1 - std::pow(beta1, double(in.step)) : 1.0;
    const double bc2 = p_.bias_correction ? 1 - std::pow(beta2, double(in.step)) : 1.0;
    // Phase 1: moments and the raw update u, kept for phase 2; partial squared norms per parameter.
    std::vector<at::Tensor> updates;
    for (const auto& s : segments) {
      const int64_t n = s.params.numel();
      at::Tensor m = exp_avg_.narrow(0, s.local_offset, n), v = exp_avg_sq_.narrow(0, s.local_offset, n);
      at::Tensor g = s.grads.to(at::kFloat) * in.grad_scale;  // bf16 gradients computed in fp32
      m.mul_(beta1).add_(g, 1 - beta1);
      v.mul_(beta2).addcmul_(g, g, 1 - beta2);
      at::Tensor u = (m / bc1).div_(v.div(bc2).sqrt_().add_(p_.eps));
      if (in.weight_decay != 0) u.add_(s.params, in.weight_decay);
      updates.push_back(u);
    }
    // [‖p‖² per param, ‖u‖² per param], summed on the device: no host synchronization in the step.
    std::vector<at::Tensor> p_sq, u_sq;
    std::vector<int64_t> index;
    for_each_piece(segments, updates, [&](const ShardPiece& piece, const at::Tensor& p, const at::Tensor& u) {
      p_sq.push_back(p.square().sum());
      u_sq.push_back(u.square().sum());
      index.push_back(piece.param);
    });
    const auto device = segments.empty() ? at::Device(at::kCPU) : segments.front().params.device();
    at::Tensor sums = at::zeros({2, ctx_.num_params}, at::TensorOptions().dtype(at::kDouble).device(device));
    if (!index.empty()) {
      at::Tensor idx = at::tensor(index, at::TensorOptions().dtype(at::kLong)).to(device);
      sums.select(0, 0).index_add_(0, idx, at::stack(p_sq).to(at::kDouble));
      sums.select(0, 1).index_add_(0, idx, at::stack(u_sq).to(at::kDouble));
    }
    if (ctx_.sum_across_ranks) ctx_.sum_across_ranks(sums);
    // trust = clamp(‖p‖/‖u‖, min_coeff, max_coeff), and 1 where either norm is 0 (DeepSpeed's FusedLamb).
    at::Tensor w = sums.select(0, 0).sqrt(), un = sums.select(0, 1).sqrt();
    at::Tensor trust = at::where((w > 0).logical_and(un > 0), w / un, at::ones_like(w))
                           .clamp_(p_.min_coeff, p_.max_coeff);
    if (ctx_.on_trust_ratios) ctx_.on_trust_ratios(trust);
    trust = trust.mul(-in.lr).to(at::kFloat);
    // Phase 2: p ← p − lr · trust · u, with the trust ratio of the whole parameter.
    for_each_piece(segments, updates, [&](const ShardPiece& piece, const at::Tensor& p, const at::Tensor& u) {
      p.addcmul_(u, trust.select(0, piece.param));
    });
    for (const auto& s : segments) write_compute_copy(s);
  }
  bool elementwise() const override { return false; }
  int64_t state_bytes() const override { return exp_avg_.nbytes() + exp_avg_sq_.nbytes(); }
  const char* name() const override { return "Lamb"; }
  std::vector<std::pair<std::string, at::Tensor>> named_state() const override {
    return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
  }

 private:
  // Calls f(piece, params view, update view) for each parameter piece inside the segments.
  template <class F>
  void for_each_piece(const std::vector<ShardSegment>& segments, const std::vector<at::Tensor>& updates, F f) {
    for (const auto& piece : ctx_.pieces) {
      for (size_t i = 0; i < segments.size(); ++i) {
        const auto& s = segments[i];
        const int64_t begin = piece.local_offset - s.local_offset;
        if (begin < 0 || begin + piece.numel > s.params.numel()) continue;
        f(piece, s.params.narrow(0, begin, piece.numel), updates[i].narrow(0, begin, piece.numel));
        break;
      }
    }
  }

  OptimizerHyperparams p_;
  at::Tensor exp_avg_, exp_avg_sq_;
  OptimizerContext ctx_;
};

}  // namespace

void FlatOptimizer::step_with_state(const StepInputs&, const std::vector<ShardSegment>&, const std::vector<at::Tensor>&,
                                    int64_t) {
  throw std::logic_error(std::string("tessera: ") + name() + " does not step with external state (not elementwise)");
}

std::unique_ptr<FlatOptimizer> make_flat_optimizer(const std::string& t, const OptimizerHyperparams& params, int64_t shard_numel,
                                                   const at::TensorOptions& options, OptimizerContext context) {
  if (t == "Adam" || t == "AdamW") return std::make_unique<Adam>(params, shard_numel, options);
  if (t == "SGD") return std::make_unique<Sgd>(params, shard_numel, options);
  if (t == "Lamb") return std::make_unique<Lamb>(params, shard_numel, options, std::move(context));
  if (is_onebit_optimizer(t)) return make_onebit_optimizer(t, params, shard_numel, options, std::move(context));
  throw std::invalid_argument("tessera: optimizer.type \"" + t +
                              "\" is not available in the engine (Adam, AdamW, SGD, Lamb, OneBitAdam, ZeroOneAdam and "
                              "OneBitLamb are)");
}

bool is_onebit_optimizer(const std::string& t) { return t == "OneBitAdam" || t == "ZeroOneAdam" || t == "OneBitLamb"; }

}  // namespace tessera
