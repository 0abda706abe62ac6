// Tokens to their experts and back, over the expert-parallel group (DeepSpeed-MoE, Rajbhandari et
// al. 2022, §4; GShard's dispatch/combine without its dense [tokens, experts, capacity] masks).
//
// The group's P ranks hold E/P experts each, rank j experts [j·E/P, (j+1)·E/P). Dispatch gathers
// each kept choice's token into a send buffer grouped by expert, one all-to-all delivers every
// rank's rows to the ranks of their experts, and expert_inputs() hands each local expert the rows
// it got from every rank. combine() sends the experts' outputs back by the reverse all-to-all and
// sums each token's rows weighted by its routing weights. Both directions are autograd functions
// (the backward of an all-to-all is the all-to-all of the gradients the other way), and the
// gathers and sums are index_select / index_add, so gradients reach the tokens, the experts and
// the router's weights.
//
//   with capacity C   the send buffer is [E, C, H], a choice at (its expert, its slot), zero where
//                     an expert got fewer than C: equal splits, one all-to-all each way
//   dropless          rows only for the choices there are, sorted by expert; the per-expert counts
//                     go first (an all-to-all of E integers), then the rows with uneven splits
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
  // Per local expert, its rows from every rank ([n, H]; n = P·C with a capacity).
  const std::vector<at::Tensor>& expert_inputs() const { return expert_inputs_; }
  // The experts' outputs, one [n, H'] per local expert in expert_inputs()'s order -> [T, H'].
  at::Tensor combine(const std::vector<at::Tensor>& expert_outputs) const;

  int64_t rows_sent() const { return rows_sent_; }  // rows this rank sent to other ranks (each way)

 private:
  Communicator* group_ = nullptr;
  int64_t ranks_ = 1, experts_ = 0, local_experts_ = 0, first_expert_ = 0, capacity_ = -1, tokens_ = 0;
  at::Tensor token_of_row_;   // per kept choice, in send order: its token
  at::Tensor send_row_;       // with a capacity: per kept choice, its row in the [E·C] send buffer
  at::Tensor weight_of_row_;  // per kept choice, its routing weight (differentiable)
  std::vector<int64_t> send_splits_, recv_splits_;  // rows, per rank (dropless)
  at::Tensor to_expert_major_;  // dropless: received rows reordered by local expert (undefined: none needed)
  std::vector<int64_t> rows_per_expert_;  // dropless: rows each local expert got
  std::vector<at::Tensor> expert_inputs_;
  int64_t rows_sent_ = 0;
};

// The all-to-all as an autograd function over the rows of a [N, H] tensor: send_splits[j] rows go
// to group rank j, recv_splits[i] arrive from rank i; the backward sends the gradients back.
at::Tensor all_to_all_rows(const at::Tensor& rows, Communicator& group, const std::vector<int64_t>& send_splits,
                           const std::vector<int64_t>& recv_splits);

}  // namespace tessera
