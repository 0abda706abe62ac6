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
//
// Scale blocks: one scale for a whole flat buffer of many parameters would give a parameter whose
// values are small a step as large as the buffer's RMS (the error feedback takes it back only on
// later calls). DeepSpeed compresses each parameter tensor on its own, one collective per tensor;
// here the buffer stays one collective and each block (a parameter's range) gets its own scale:
// s_w,b = ‖b_block‖/√len for each block, and the server's chunk is cut where the blocks are, one
// scale per piece. The scales travel as p × B floats (B blocks), next to the N/8 bytes of signs.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace tessera {

class Communicator;

// N: n rounded up to a multiple of 8 · ranks.
int64_t compressed_padded_size(int64_t n, int ranks);

struct CompressionErrors {
  at::Tensor worker;  // N fp32 elements
  at::Tensor server;  // N / ranks
  static CompressionErrors zeros(int64_t n, const Communicator& group);
};

// x: a contiguous fp32 tensor (any shape) on the group's device (CPU tensors are packed by
// csrc/sign_pack.h's kernels, others by ATen operations in the same format); replaced in place by the estimate
// of its mean over `group`. `errors` come from CompressionErrors::zeros(x.numel(), group) and are
// carried from call to call. `block_starts`: where each scale block begins, ascending from 0, each
// < x.numel() (empty: one block); the last block takes the padding. Bytes each rank sends
// (Communicator's sent_bytes): (p−1)/p · N/8 by the all-to-all, (p−1)/p · N/8 by the all-gather of
// the servers' signs, and (p−1) · 2B scales: 2·(p−1)/p · N/8 in all against the fp32 ring
// allreduce's 2·(p−1)/p · 4n, 1/32 of it.
void compressed_allreduce(at::Tensor& x, CompressionErrors& errors, Communicator& group,
                          const std::vector<int64_t>& block_starts = {});

}  // namespace tessera
