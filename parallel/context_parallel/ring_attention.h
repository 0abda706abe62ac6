// Ring attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers"): exact attention
// over a sequence split across the context group, for any number of heads. Each rank keeps its
// queries; the key/value blocks travel around the ring (rank r sends to r+1, receives from r−1),
// the next block's transfer overlapped with the current block's attention. The partial outputs
// merge by the online-softmax rule (Milakov & Gimelshein 2018; FlashAttention): with each block's
// log-sum-exp l_b, l = log Σ exp(l_b) and out = Σ exp(l_b − l)·out_b.
//
// The backward passes the blocks around again, each with a gradient accumulator for its keys and
// values that every rank adds its part to; after N steps the accumulator reaches the block's owner.
// Each block's part is the attention backward with the *global* output and log-sum-exp, which is
// exact (FlashAttention's backward recomputes the probabilities from them).
//
// Causal masking uses the balanced layout (layout.h): rank r holds chunks r and 2N−1−r, so every
// step costs every rank the same (half the chunk pairs; the diagonal ones at step 0), and the pairs
// a causal mask removes are never computed.
//
// q, k, v: [B, H, S_local, D] (SDPA's layout) with the same heads; the output likewise. Block
// attention is ATen's fused CPU flash kernel on the CPU and an explicit fp32 softmax elsewhere (or
// everywhere with kernel "math"); accumulators are fp32 whatever the inputs' dtype.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

namespace tessera {

class Communicator;

struct RingAttentionOptions {
  bool causal = true;
  std::optional<double> scale;  // default 1/sqrt(D)
  std::string kernel = "auto";  // "auto" (flash on the CPU, else math) or "math"
};

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Communicator& context,
                          const RingAttentionOptions& options = {});

}  // namespace tessera
