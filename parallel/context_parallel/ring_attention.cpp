#include "parallel/context_parallel/ring_attention.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/full.h>
#include <ATen/ops/logaddexp.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <stdexcept>
#include <utility>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/tensor_parallel/regions.h"

namespace tessera {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int kBlockTag = 7301;     // key/value blocks around the ring
constexpr int kGradientTag = 7302;  // their gradient accumulators

enum class Mask { None, Full, Causal };  // a chunk pair: skipped, attended whole, or its diagonal

// Under the balanced layout with a causal mask: query chunk `qc` against key chunk `kc` (global
// chunk indices). Without a causal mask every pair is whole.
Mask pair_mask(bool causal, int64_t qc, int64_t kc) {
  if (!causal) return Mask::Full;
  return kc < qc ? Mask::Full : kc == qc ? Mask::Causal : Mask::None;
}

struct Kernel {
  bool flash = false;
  double scale = 1.0;

  // (out [B,H,Sq,D] fp32, lse [B,H,Sq] fp32) of q against k, v.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                            bool causal) const {
    if (flash) {
      auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, std::nullopt, scale);
      return {out.to(at::kFloat), lse.to(at::kFloat)};
    }
    at::Tensor s = at::matmul(q.to(at::kFloat), k.to(at::kFloat).transpose(-2, -1)) * scale;
    if (causal) s = s.masked_fill(causal_mask(s), -INFINITY);
    at::Tensor lse = at::logsumexp(s, -1);
    at::Tensor p = at::exp(s - lse.unsqueeze(-1));
    return {at::matmul(p, v.to(at::kFloat)), lse};
  }

  // (dq, dk, dv) in fp32 of this pair's part, from the global out and lse of the queries.
  std::vector<at::Tensor> backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, bool causal) const {
    if (flash) {
      auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
          dout.to(q.scalar_type()), q, k, v, out.to(q.scalar_type()), lse, 0.0, causal, std::nullopt, scale);
      return {dq.to(at::kFloat), dk.to(at::kFloat), dv.to(at::kFloat)};
    }
    const at::Tensor qf = q.to(at::kFloat), kf = k.to(at::kFloat), vf = v.to(at::kFloat);
    at::Tensor s = at::matmul(qf, kf.transpose(-2, -1)) * scale;
    if (causal) s = s.masked_fill(causal_mask(s), -INFINITY);
    at::Tensor p = at::exp(s - lse.unsqueeze(-1));
    at::Tensor dv = at::matmul(p.transpose(-2, -1), dout);
    at::Tensor dp = at::matmul(dout, vf.transpose(-2, -1));
    at::Tensor delta = (dout * out).sum(-1, true);
    at::Tensor ds = p * (dp - delta);
    return {at::matmul(ds, kf) * scale, at::matmul(ds.transpose(-2, -1), qf) * scale, dv};
  }

  static at::Tensor causal_mask(const at::Tensor& s) {
    const int64_t n = s.size(-2), m = s.size(-1);
    return at::ones({n, m}, s.options().dtype(at::kBool)).triu(1);
  }
};

struct Ring {
  Communicator& group;
  int64_t ranks, rank;
  bool causal;
  Kernel kernel;

  int64_t source(int64_t step) const { return (rank - step + ranks) % ranks; }  // whose block step s holds
  // The global chunk indices rank `r` holds, and how many pieces its local sequence is cut into.
  std::vector<int64_t> chunks(int64_t r) const {
    if (!causal) return {r};
    return {r, 2 * ranks - 1 - r};
  }
  int64_t next() const { return (rank + 1) % ranks; }
  int64_t prev() const { return (rank - 1 + ranks) % ranks; }
};

// Starts sending `block` to the next rank and receiving the previous rank's into `into`.
std::vector<CommHandle> pass_on(Ring& ring, at::Tensor& block, at::Tensor& into, int tag) {
  std::vector<CommHandle> handles;
  handles.push_back(ring.group.send_async(block, static_cast<int>(ring.next()), tag));
  handles.push_back(ring.group.recv_async(into, static_cast<int>(ring.prev()), tag));
  return handles;
}

void wait_all(std::vector<CommHandle>& handles) {
  for (CommHandle& h : handles) h.wait();
  handles.clear();
}

// The key/value block's trip to the next rank during step `step`'s attention (none at the last step).
struct NextBlock {
  at::Tensor arriving;
  std::vector<CommHandle> transfer;

  NextBlock(Ring& ring, int64_t step, at::Tensor& block) {
    if (step + 1 >= ring.ranks) return;
    arriving = at::empty_like(block);
    transfer = pass_on(ring, block, arriving, kBlockTag);
  }
  // Waits for the exchange and makes the arrived block the current one.
  void take(at::Tensor& block) {
    wait_all(transfer);
    if (arriving.defined()) block = arriving;
  }
};

std::pair<at::Tensor, at::Tensor> ring_forward(Ring& ring, const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& v) {
  const std::vector<int64_t> mine = ring.chunks(ring.rank);
  const int64_t pieces = static_cast<int64_t>(mine.size());
  const int64_t chunk = q.size(2) / pieces, kv_chunk = k.size(2) / pieces;
  std::vector<at::Tensor> out(pieces), lse(pieces);
  at::Tensor block = at::stack({k, v}).contiguous();  // [2, B, H, S_local, D]: one message per step
  for (int64_t step = 0; step < ring.ranks; ++step) {
    NextBlock next(ring, step, block);
    const std::vector<int64_t> theirs = ring.chunks(ring.source(step));
    for (int64_t i = 0; i < pieces; ++i)
      for (int64_t j = 0; j < pieces; ++j) {
        const Mask m = pair_mask(ring.causal, mine[i], theirs[j]);
        if (m == Mask::None) continue;
        auto [o, l] = ring.kernel.forward(q.narrow(2, i * chunk, chunk), block[0].narrow(2, j * kv_chunk, kv_chunk),
                                          block[1].narrow(2, j * kv_chunk, kv_chunk), m == Mask::Causal);
        if (!out[i].defined()) {
          out[i] = o, lse[i] = l;
          continue;
        }
        at::Tensor merged = at::logaddexp(lse[i], l);
        out[i] = out[i] * at::exp(lse[i] - merged).unsqueeze(-1) + o * at::exp(l - merged).unsqueeze(-1);
        lse[i] = merged;
      }
    next.take(block);
  }
  // [B, H, S, D] over (b, s, h, d) memory, as SDPA's kernels write it: the caller's transpose back
  // to [B, S, H·D] is then free, and the output the backward keeps is the storage the projection
  // after attention keeps as its input (one copy, not two).
  at::Tensor merged = at::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, q.options().dtype(at::kFloat)).transpose(1, 2);
  for (int64_t i = 0; i < pieces; ++i) merged.narrow(2, i * chunk, chunk).copy_(out[i]);
  return {merged, pieces == 1 ? lse[0] : at::cat(lse, 2)};
}

std::vector<at::Tensor> ring_backward(Ring& ring, const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse) {
  const std::vector<int64_t> mine = ring.chunks(ring.rank);
  const int64_t pieces = static_cast<int64_t>(mine.size());
  const int64_t chunk = q.size(2) / pieces, kv_chunk = k.size(2) / pieces;
  const at::Tensor dout32 = dout.to(at::kFloat);
  at::Tensor dq = at::zeros_like(q, q.options().dtype(at::kFloat));
  at::Tensor block = at::stack({k, v}).contiguous();
  at::Tensor arriving;                 // the accumulator for this step's block, from the previous rank
  std::vector<CommHandle> gradients;  // its transfer (and the send of the last one)
  at::Tensor sent;                     // kept alive until its send completes
  for (int64_t step = 0; step < ring.ranks; ++step) {
    NextBlock next(ring, step, block);
    at::Tensor part = at::zeros_like(block, block.options().dtype(at::kFloat));  // this rank's share for the block
    const std::vector<int64_t> theirs = ring.chunks(ring.source(step));
    for (int64_t i = 0; i < pieces; ++i)
      for (int64_t j = 0; j < pieces; ++j) {
        const Mask m = pair_mask(ring.causal, mine[i], theirs[j]);
        if (m == Mask::None) continue;
        const at::Tensor kj = block[0].narrow(2, j * kv_chunk, kv_chunk), vj = block[1].narrow(2, j * kv_chunk, kv_chunk);
        auto g = ring.kernel.backward(dout32.narrow(2, i * chunk, chunk), q.narrow(2, i * chunk, chunk), kj, vj,
                                      out.narrow(2, i * chunk, chunk), lse.narrow(2, i * chunk, chunk),
                                      m == Mask::Causal);
        dq.narrow(2, i * chunk, chunk).add_(g[0]);
        part[0].narrow(2, j * kv_chunk, kv_chunk).add_(g[1]);
        part[1].narrow(2, j * kv_chunk, kv_chunk).add_(g[2]);
      }
    wait_all(gradients);  // the accumulator for this block has arrived (and the previous send is done)
    if (arriving.defined()) part.add_(arriving);
    // On to the next rank, which holds this block at the next step; the last step's goes to its owner.
    sent = part;
    arriving = at::empty_like(part);
    gradients = pass_on(ring, sent, arriving, kGradientTag);
    next.take(block);
  }
  wait_all(gradients);  // `arriving` is now this rank's own keys' and values' whole gradient
  return {dq.to(q.scalar_type()), arriving[0].to(k.scalar_type()), arriving[1].to(v.scalar_type())};
}

struct RingAttention : torch::autograd::Function<RingAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            int64_t comm, bool causal, double scale, bool flash) {
    Communicator& group = communicator_of(comm);
    Ring ring{group, group.size(), group.rank(), causal, Kernel{flash, scale}};
    auto [out, lse] = ring_forward(ring, q, k, v);
    at::Tensor result = out.to(q.scalar_type());
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["flash"] = flash;
    return result;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const auto saved = ctx->get_saved_variables();
    Communicator& group = communicator_of(ctx->saved_data["comm"].toInt());
    Ring ring{group, group.size(), group.rank(), ctx->saved_data["causal"].toBool(),
              Kernel{ctx->saved_data["flash"].toBool(), ctx->saved_data["scale"].toDouble()}};
    auto grads = ring_backward(ring, g[0], saved[0], saved[1], saved[2], saved[3], saved[4]);
    return {grads[0], grads[1], grads[2], at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Communicator& context,
                          const RingAttentionOptions& options) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4)
    throw std::invalid_argument("tessera: ring attention takes q, k, v as [batch, heads, sequence, head_dim], got " +
                                c10::str(q.sizes()) + ", " + c10::str(k.sizes()) + ", " + c10::str(v.sizes()));
  if (k.sizes() != v.sizes() || q.size(0) != k.size(0) || q.size(1) != k.size(1) || q.size(3) != k.size(3))
    throw std::invalid_argument("tessera: ring attention: q " + c10::str(q.sizes()) + " and k/v " + c10::str(k.sizes()) +
                                " differ in batch, heads or head_dim (repeat grouped key/value heads first)");
  const int64_t pieces = options.causal ? 2 : 1;
  if (q.size(2) % pieces != 0 || k.size(2) % pieces != 0)
    throw std::invalid_argument("tessera: causal ring attention holds two chunks of the sequence per rank: the local "
                                "length " + std::to_string(q.size(2)) + " is odd (shard with the ring layout)");
  if (options.kernel != "auto" && options.kernel != "math")
    throw std::invalid_argument("tessera: ring attention kernel must be \"auto\" or \"math\", got \"" + options.kernel + "\"");
  const double scale = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));
  const bool flash = options.kernel == "auto" && q.device().is_cpu();
  return RingAttention::apply(q, k, v, communicator_handle(context), options.causal, scale, flash);
}

}  // namespace tessera
