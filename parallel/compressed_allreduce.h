// The error-compensated 1-bit allreduce of 1-bit Adam (Tang et al. 2021, Algorithm 1 and §3.3;
// DeepSpeed's compressed_allreduce): each rank sends ~1 bit per element and keeps what the
// compression lost in error buffers that are added back the next time, so the errors do not
// accumulate. On p ranks, for a flat fp32 tensor of n elements padded to N (a multiple of 8·p):
//
//   worker:  b = x + e_w;  s_w = ‖b‖/√N;  e_w = b − s_w·sign(b);  send sign(b) packed (N/8 bytes)
//            chunk j (N/p elements) to rank j (all-to-all), and s_w to every rank (all-gather)
//   server:  for my chunk c = (1/p)·Σ_j s_w,j·sign_j + e_s;  s_s = ‖c‖/√(N/p);  e_s = c − s_s·sign(c)
//            all-gather sign(c) packed and s_s
//   result:  x = the concatenated s_s,j·sign_j (an estimate of the mean of the ranks' x)
//
// sign(0) = +1 (csrc/sign_pack.h's wire format). The buffers are named state of the optimizer that
// owns them (DeepSpeed resets them when loading a checkpoint).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace tessera {

class Communicator;

// N: n rounded up to a multiple of 8 · ranks.
int64_t compressed_padded_size(int64_t n, int ranks);

struct CompressionErrors {
  at::Tensor worker;  // N fp32 elements
  at::Tensor server;  // N / ranks
  static CompressionErrors zeros(int64_t n, const Communicator& group);
};

// x: a contiguous fp32 tensor (any shape) on the group's device; replaced in place by the estimate
// of its mean over `group`. `errors` come from CompressionErrors::zeros(x.numel(), group) and are
// carried from call to call. Bytes sent per rank: N/8 (all-to-all) + N/8 (all-gather) + 2p scales.
void compressed_allreduce(at::Tensor& x, CompressionErrors& errors, Communicator& group);

}  // namespace tessera
