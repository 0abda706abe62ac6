// The router of a Mixture-of-Experts layer: which experts each token goes to, with what weight, and
// which of those choices an expert's capacity drops.
//
// Top-1 is Switch (Fedus et al. 2021), top-2 GShard (Lepikhin et al. 2020), general top-k as in
// DeepSpeed-MoE (Rajbhandari et al. 2022); the rules are DeepSpeed's (deepspeed/moe/sharded_moe.py),
// so a DeepSpeed MoE model computes the same numbers here:
//   probs     softmax of the fp32 logits over the experts
//   choices   top-1: argmax of probs (of logits + Gumbel noise with rsample); top-2: the argmax,
//             then the argmax of the other logits (+ Gumbel noise when second_expert_sampling);
//             k > 2: the k largest probs
//   capacity  ceil(tokens / experts · capacity_factor · k), at least min_capacity, per expert;
//             dropless (drop_tokens false): none, every choice is kept
//   priority  first choices before second choices, and within them token order (GShard); top-1
//             with use_rts: random priority among the tokens an expert got (DeepSpeed's RTS)
//   weight    top-1: the chosen expert's prob; k ≥ 2: the kept choices' probs normalized to sum 1
//   l_aux     E · Σ_e mean(probs_e) · fraction of tokens whose first choice is e (k ≤ 2), or
//             E/k · Σ_e mean(probs_e) · fraction of all choices that are e (k > 2): the
//             load-balancing loss, differentiable through the probs; plus z_loss_coef ·
//             mean(logsumexp(logits)²), the router z-loss of ST-MoE (Zoph et al. 2022)
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace tessera {

struct GateOptions {
  int64_t k = 1;
  double capacity_factor = 1.0;
  int64_t min_capacity = 4;
  bool drop_tokens = true;
  bool use_rts = true;                 // top-1 with drop_tokens: random token priority
  bool second_expert_sampling = true;  // top-2: DeepSpeed's top2_2nd_expert_sampling
  bool rsample = false;                // top-1: noisy_gate_policy "RSample" (training only)
  double z_loss_coef = 0;
};

// One routing decision for T tokens over E experts, k choices each.
struct Routing {
  int64_t tokens = 0, experts = 0, k = 1;
  int64_t capacity = -1;  // slots per expert; -1 dropless
  at::Tensor expert;      // [T, k] int64: the expert of each choice
  at::Tensor slot;        // [T, k] int64: the choice's place among its expert's choices, by priority
  at::Tensor kept;        // [T, k] bool: not dropped by the capacity
  at::Tensor weight;      // [T, k] fp32, differentiable: 0 where dropped
  at::Tensor l_aux;       // scalar fp32, differentiable
  at::Tensor exp_counts;  // [E] int64 on the CPU: choices per expert before dropping
  int64_t dropped = 0;    // choices dropped by the capacity
};

// ceil(tokens / experts · factor), at least min_capacity (DeepSpeed's _capacity).
int64_t expert_capacity(int64_t tokens, int64_t experts, double factor, int64_t min_capacity);

// `logits`: [T, E], any float dtype (computed in fp32). `training`: rsample only then. Throws
// std::invalid_argument when k is not in 1..E or the options make no sense.
Routing route(const at::Tensor& logits, const GateOptions& options, bool training);

}  // namespace tessera
