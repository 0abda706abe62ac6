// Tokens to their experts and back, over the expert-parallel group (DeepSpeed-MoE, Rajbhandari et
// al. 2022, §4; GShard's dispatch/combine without its dense [tokens, experts, capacity] masks).
//
// The group's P ranks hold E/P experts each, rank j experts [j·E/P, (j+1)·E/P). Dispatch gathers
// each kept choice's token into a send buffer grouped by expert (a choice's row: its expert's offset
// plus its slot), the per-expert counts go first (an all-to-all of E integers), one all-to-all with
// uneven splits delivers every rank's rows to the ranks of their experts, and expert_inputs() hands
// each local expert the rows it got from every rank. combine() sends the experts' outputs back by the
// reverse all-to-all and sums each token's rows weighted by its routing weights. Every step is
// differentiable with a backward of one pass: the all-to-alls run the other way, the reorder by
// expert is a permutation (its backward the inverse permutation), the experts' inputs are a split
// (backward: one concatenation), so gradients reach the tokens, the experts and the router.
//
// Only kept choices travel and reach an expert, with a capacity as without one: an expert that got
// fewer than C tokens computes on those, not on C rows padded with zeros as DeepSpeed's and
// Megatron's "drop and pad" do. The results are the same (a padding row's output is multiplied by
// a zero weight, and its gradient is zero), the all-to-all's bytes and the experts' FLOPs are the
// kept choices' (docs/moe.md). This assumes what every MoE expert is, a function of each row on its
// own (an MLP); an expert that mixes rows (batch statistics) sees a different batch than with padding.
//
// With no group (or a group of one) nothing is sent. Every rank of the group must dispatch the
// same number of times with the same E and H (they are collectives).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "parallel/moe/gating.h"

namespace tessera {

class Communicator;

class Dispatch {
 public:
  // `tokens`: [T, H]. `expert_parallel`: the group the experts are spread over, or nullptr.
  Dispatch(const at::Tensor& tokens, const Routing& routing, Communicator* expert_parallel);

  int64_t local_experts() const { return local_experts_; }
  int64_t first_expert() const { return first_expert_; }  // the global index of local expert 0
  // Per local expert, its rows from every rank ([n, H], n its kept choices over the group).
  const std::vector<at::Tensor>& expert_inputs() const { return expert_inputs_; }
  // The experts' outputs, one [n, H'] per local expert in expert_inputs()'s order -> [T, H'].
  at::Tensor combine(const std::vector<at::Tensor>& expert_outputs) const;

  int64_t rows_sent() const { return rows_sent_; }  // rows this rank sent to other ranks (each way)

 private:
  Communicator* group_ = nullptr;
  int64_t ranks_ = 1, experts_ = 0, local_experts_ = 0, first_expert_ = 0, tokens_ = 0;
  at::Tensor token_of_row_;   // per row of the send buffer (a kept choice): its token
  at::Tensor weight_of_row_;  // per row of the send buffer: its routing weight (differentiable)
  std::vector<int64_t> send_splits_, recv_splits_;  // rows, per rank
  // Received rows are [from rank][local expert]; each expert wants its rows together:
  at::Tensor to_expert_major_, from_expert_major_;  // the permutation and its inverse (undefined: one expert)
  std::vector<int64_t> rows_per_expert_;  // rows each local expert got
  std::vector<at::Tensor> expert_inputs_;
  int64_t rows_sent_ = 0;
};

// The all-to-all as an autograd function over the rows of a [N, H] tensor: send_splits[j] rows go
// to group rank j, recv_splits[i] arrive from rank i; the backward sends the gradients back.
at::Tensor all_to_all_rows(const at::Tensor& rows, Communicator& group, const std::vector<int64_t>& send_splits,
                           const std::vector<int64_t>& recv_splits);

}  // namespace tessera
