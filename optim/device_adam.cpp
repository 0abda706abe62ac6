#include "optim/device_adam.h"

#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/empty.h>

namespace tessera {

bool device_adam_applies(const std::vector<ShardSegment>& segments, const at::Tensor& exp_avg, bool bias_correction) {
  if (!bias_correction || segments.empty() || !exp_avg.is_cuda() || exp_avg.scalar_type() != at::kFloat) return false;
  for (const auto& s : segments) {
    if (!s.params.is_cuda() || s.params.scalar_type() != at::kFloat || !s.params.is_contiguous()) return false;
    if (!s.grads.is_cuda() || !s.grads.is_contiguous()) return false;
    if (s.params.device() != exp_avg.device() || s.grads.device() != exp_avg.device()) return false;
  }
  return true;
}

void device_adam_step(const DeviceAdamStep& in, const std::vector<ShardSegment>& segments, at::Tensor& exp_avg,
                      at::Tensor& exp_avg_sq, at::Tensor& step_count, at::Tensor& inverse_grad_scale) {
  const auto options = exp_avg.options().dtype(at::kFloat);
  if (!step_count.defined()) step_count = at::empty({}, options);
  step_count.fill_(static_cast<double>(in.step));  // the kernel reads the step, torch's Python increments it
  std::optional<at::Tensor> grad_scale;
  if (in.grad_scale != 1.0) {
    if (!inverse_grad_scale.defined()) inverse_grad_scale = at::empty({}, options);
    inverse_grad_scale.fill_(1.0 / in.grad_scale);  // the kernel divides the gradients by it
    grad_scale = inverse_grad_scale;
  }
  std::vector<at::Tensor> params, grads, m, v, steps, copies, copy_sources;
  for (const auto& s : segments) {
    const int64_t n = s.params.numel();
    params.push_back(s.params);
    // bf16 gradients (data_types.grad_accum_dtype) are widened: the kernel wants one dtype.
    grads.push_back(s.grads.scalar_type() == at::kFloat ? s.grads : s.grads.to(at::kFloat));
    m.push_back(exp_avg.narrow(0, s.local_offset, n));
    v.push_back(exp_avg_sq.narrow(0, s.local_offset, n));
    steps.push_back(step_count);
    if (s.compute_copy.defined()) copies.push_back(s.compute_copy), copy_sources.push_back(s.params);
  }
  if (in.adam_w_mode)
    at::_fused_adamw_(params, grads, m, v, {}, steps, in.lr, in.beta1, in.beta2, in.weight_decay, in.eps,
                      /*amsgrad=*/false, /*maximize=*/false, grad_scale);
  else
    at::_fused_adam_(params, grads, m, v, {}, steps, in.lr, in.beta1, in.beta2, in.weight_decay, in.eps,
                     /*amsgrad=*/false, /*maximize=*/false, grad_scale);
  if (!copies.empty()) at::_foreach_copy_(copies, copy_sources);
}

}  // namespace tessera
