// Adam/AdamW over a rank's shard on a GPU: ATen's fused multi-tensor kernel (_fused_adam_ /
// _fused_adamw_, the kernel behind torch.optim.Adam(fused=True)), one launch for all the segments
// of a step instead of the eight elementwise kernels per segment of the generic path. The compute
// copies (bf16/fp16) are written by one _foreach_copy_. The formulas are flat_optimizer.h's.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "optim/options.h"
#include "optim/shard.h"

namespace tessera {

// Whether the fused kernel takes these segments: fp32 master parameters and states on a CUDA
// device, contiguous, with bias correction (the kernel always applies it).
bool device_adam_applies(const std::vector<ShardSegment>& segments, const at::Tensor& exp_avg, bool bias_correction);

struct DeviceAdamStep {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool adam_w_mode = true;
  int64_t step = 1;
  double grad_scale = 1;  // the gradients are multiplied by it
};

// One fused update of every segment. `step_count` and `inverse_grad_scale` are one-element fp32
// tensors on the device that this call refills (a fill is a kernel argument, not a host copy).
void device_adam_step(const DeviceAdamStep& in, const std::vector<ShardSegment>& segments, at::Tensor& exp_avg,
                      at::Tensor& exp_avg_sq, at::Tensor& step_count, at::Tensor& inverse_grad_scale);

}  // namespace tessera
