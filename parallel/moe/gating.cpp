#include "parallel/moe/gating.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/one_hot.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace tessera {

namespace {

at::Tensor gumbel_like(const at::Tensor& t) {
  // -log(-log(U)), U uniform in (0, 1): argmax(logits + it) samples from softmax(logits).
  const double tiny = std::numeric_limits<float>::min();
  return -(-at::rand(t.sizes(), t.options()).clamp(tiny, 1.0 - 1e-7).log()).log();
}

// [T, k] int64: the experts each token chooses, by the rules of gating.h.
at::Tensor choose(const at::Tensor& logits, const at::Tensor& probs, const GateOptions& o, bool training) {
  if (o.k == 1) return (o.rsample && training ? logits + gumbel_like(logits) : probs).argmax(1, true);
  if (o.k == 2) {
    at::Tensor first = probs.argmax(1, true);
    at::Tensor other = o.second_expert_sampling ? logits + gumbel_like(logits) : logits.clone();
    other.scatter_(1, first, -std::numeric_limits<float>::infinity());
    return at::cat({first, other.argmax(1, true)}, 1);
  }
  return std::get<1>(probs.topk(o.k, 1));
}

}  // namespace

int64_t expert_capacity(int64_t tokens, int64_t experts, double factor, int64_t min_capacity) {
  const auto capacity = static_cast<int64_t>(std::ceil(static_cast<double>(tokens) / experts * factor));
  return capacity < min_capacity ? min_capacity : capacity;
}

Routing route(const at::Tensor& logits_in, const GateOptions& o, bool training) {
  if (logits_in.dim() != 2)
    throw std::invalid_argument("tessera.moe: the router's logits must be [tokens, experts], got " +
                                c10::str(logits_in.sizes()));
  Routing r;
  r.tokens = logits_in.size(0);
  r.experts = logits_in.size(1);
  r.k = o.k;
  if (o.k < 1 || o.k > r.experts)
    throw std::invalid_argument("tessera.moe: k = " + std::to_string(o.k) + " must be between 1 and num_experts (" +
                                std::to_string(r.experts) + ")");
  if (o.drop_tokens && (o.capacity_factor <= 0 || o.min_capacity < 0))
    throw std::invalid_argument("tessera.moe: capacity_factor must be > 0 and min_capacity >= 0");
  const int64_t T = r.tokens, E = r.experts, k = o.k;
  at::Tensor logits = logits_in.to(at::kFloat);
  at::Tensor probs = logits.softmax(1);
  r.expert = choose(logits, probs, o, training);  // [T, k]

  // One-hot of every choice, choice-major ([k, T, E]): a cumulative count along it is each
  // choice's place in its expert's queue, first choices before second ones.
  at::Tensor hot = at::one_hot(r.expert.t().contiguous(), E);  // [k, T, E] int64
  at::Tensor place = (hot.view({k * T, E}).cumsum(0) - 1).view({k, T, E});
  r.slot = (place * hot).sum(2).t().contiguous();  // [T, k]
  at::Tensor counts = hot.sum(0).sum(0);           // [E]
  r.exp_counts = counts.to(at::kCPU);

  // The load-balancing loss (DeepSpeed's: first choices for k <= 2, all of them above).
  at::Tensor mean_prob = probs.mean(0);
  at::Tensor fraction = (k <= 2 ? hot[0] : hot.sum(0)).to(at::kFloat).mean(0);
  r.l_aux = (mean_prob * fraction).sum() * (k <= 2 ? static_cast<double>(E) : static_cast<double>(E) / k);
  if (o.z_loss_coef > 0) r.l_aux = r.l_aux + logits.logsumexp(1).pow(2).mean() * o.z_loss_coef;

  if (!o.drop_tokens) {
    r.kept = at::ones_like(r.expert, r.expert.options().dtype(at::kBool));
  } else {
    r.capacity = expert_capacity(T, E, o.capacity_factor * k, o.min_capacity);
    if (k == 1 && o.use_rts && r.capacity < T) {
      // Random token selection: each expert keeps the `capacity` tokens it got with the largest
      // uniform score; the kept ones are then queued in token order.
      at::Tensor mask = hot[0];  // [T, E]
      at::Tensor score = at::where(mask.to(at::kBool), at::rand({T, E}, probs.options()), -1.0);
      at::Tensor top = std::get<1>(score.topk(r.capacity, 0));  // [C, E]
      at::Tensor keep = at::zeros_like(mask).scatter_(0, top, 1) * mask;
      r.kept = keep.sum(1, true).to(at::kBool);
      r.slot = ((keep.cumsum(0) - 1) * keep).sum(1, true);
    } else {
      r.kept = r.slot.lt(r.capacity);
    }
    r.dropped = r.kept.numel() - r.kept.sum().item<int64_t>();
  }
  at::Tensor chosen = probs.gather(1, r.expert) * r.kept.to(at::kFloat);
  if (k == 1) {
    r.weight = chosen;
  } else {
    const double eps = std::numeric_limits<float>::epsilon();
    r.weight = chosen / chosen.sum(1, true).clamp_min(eps);
  }
  return r;
}

}  // namespace tessera
