#include "parallel/moe/dispatch.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/custom_function.h>

#include <numeric>
#include <stdexcept>
#include <string>

#include "parallel/communicator.h"
#include "parallel/tensor_parallel/regions.h"

namespace tessera {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t total(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t(0)); }

at::Tensor exchange(const at::Tensor& rows, Communicator& group, const std::vector<int64_t>& send,
                    const std::vector<int64_t>& recv) {
  at::Tensor in = rows.contiguous();
  int64_t width = 1;
  for (int64_t d = 1; d < in.dim(); ++d) width *= in.size(d);
  std::vector<int64_t> shape = in.sizes().vec();
  shape[0] = total(recv);
  at::Tensor out = at::empty(shape, in.options());
  std::vector<int64_t> send_elements, recv_elements;
  for (int64_t n : send) send_elements.push_back(n * width);
  for (int64_t n : recv) recv_elements.push_back(n * width);
  at::Tensor flat_out = out.view(-1);
  group.all_to_all(in.view(-1), flat_out, send_elements, recv_elements);
  return out;
}

struct AllToAllRows : torch::autograd::Function<AllToAllRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rows, int64_t comm, std::vector<int64_t> send,
                            std::vector<int64_t> recv) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    return exchange(rows, communicator_of(comm), send, recv);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    Communicator& group = communicator_of(ctx->saved_data["comm"].toInt());
    return {exchange(g[0], group, ctx->saved_data["recv"].toIntVector(), ctx->saved_data["send"].toIntVector()),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor all_to_all_rows(const at::Tensor& rows, Communicator& group, const std::vector<int64_t>& send_splits,
                           const std::vector<int64_t>& recv_splits) {
  return AllToAllRows::apply(rows, communicator_handle(group), send_splits, recv_splits);
}

Dispatch::Dispatch(const at::Tensor& tokens, const Routing& r, Communicator* expert_parallel) {
  if (tokens.dim() != 2 || tokens.size(0) != r.tokens)
    throw std::invalid_argument("tessera.moe: dispatch needs the [tokens, hidden] the router saw (" +
                                std::to_string(r.tokens) + " tokens), got " + c10::str(tokens.sizes()));
  group_ = expert_parallel != nullptr && expert_parallel->size() > 1 ? expert_parallel : nullptr;
  ranks_ = group_ != nullptr ? group_->size() : 1;
  experts_ = r.experts;
  tokens_ = r.tokens;
  capacity_ = r.capacity;
  if (experts_ % ranks_ != 0)
    throw std::invalid_argument("tessera.moe: num_experts " + std::to_string(experts_) + " does not divide over the " +
                                std::to_string(ranks_) + " ranks of the expert-parallel " + group_->describe());
  local_experts_ = experts_ / ranks_;
  first_expert_ = (group_ != nullptr ? group_->rank() : 0) * local_experts_;
  const int64_t H = tokens.size(1), P = ranks_, L = local_experts_;

  // The kept choices, as flat indices into [T, k].
  at::Tensor choice = r.kept.reshape(-1).nonzero().view(-1);
  at::Tensor expert = r.expert.reshape(-1).index_select(0, choice);
  at::Tensor slot = r.slot.reshape(-1).index_select(0, choice);
  at::Tensor token = choice.div(r.k, "floor");
  at::Tensor weight = r.weight.reshape(-1).index_select(0, choice);

  if (capacity_ >= 0) {
    const int64_t C = capacity_;
    token_of_row_ = token;
    weight_of_row_ = weight;
    send_row_ = expert * C + slot;
    at::Tensor send = at::zeros({experts_ * C, H}, tokens.options()).index_add(0, send_row_, tokens.index_select(0, token));
    std::vector<int64_t> equal(P, L * C);
    at::Tensor recv = group_ != nullptr ? all_to_all_rows(send, *group_, equal, equal) : send;
    rows_sent_ = (P - 1) * L * C;
    at::Tensor by_rank = recv.view({P, L, C, H});
    for (int64_t l = 0; l < L; ++l) expert_inputs_.push_back(by_rank.select(1, l).reshape({P * C, H}));
    return;
  }

  // Dropless: rows sorted by expert (by priority within one), no padding.
  at::Tensor order = (expert * (r.tokens * r.k) + slot).argsort();
  token_of_row_ = token.index_select(0, order);
  weight_of_row_ = weight.index_select(0, order);
  at::Tensor counts = r.exp_counts.to(at::kLong).contiguous();  // every choice is kept
  const int64_t* count = counts.data_ptr<int64_t>();
  send_splits_.assign(P, 0);
  for (int64_t e = 0; e < experts_; ++e) send_splits_[e / L] += count[e];
  at::Tensor send = tokens.index_select(0, token_of_row_);
  if (group_ == nullptr) {
    rows_per_expert_.assign(count, count + experts_);
    recv_splits_ = send_splits_;
    at::Tensor x = send;
    int64_t offset = 0;
    for (int64_t n : rows_per_expert_) {
      expert_inputs_.push_back(x.narrow(0, offset, n));
      offset += n;
    }
    return;
  }
  // Each rank learns how many rows it gets for each of its experts from each rank.
  at::Tensor my_counts = counts.to(group_->device());
  at::Tensor their_counts = at::empty_like(my_counts);
  group_->all_to_all(my_counts, their_counts);
  at::Tensor got = their_counts.to(at::kCPU).view({P, L});  // [from rank, local expert]
  const int64_t* g = got.data_ptr<int64_t>();
  recv_splits_.assign(P, 0);
  rows_per_expert_.assign(L, 0);
  for (int64_t i = 0; i < P; ++i)
    for (int64_t l = 0; l < L; ++l) {
      recv_splits_[i] += g[i * L + l];
      rows_per_expert_[l] += g[i * L + l];
    }
  rows_sent_ = total(send_splits_) - send_splits_[group_->rank()];
  at::Tensor recv = all_to_all_rows(send, *group_, send_splits_, recv_splits_);
  at::Tensor x = recv;
  if (L > 1) {
    // Received rows are [from rank][local expert]; each expert wants its rows together.
    std::vector<int64_t> start(P * L), perm;
    perm.reserve(total(recv_splits_));
    for (int64_t i = 0, offset = 0; i < P; ++i)
      for (int64_t l = 0; l < L; ++l) {
        start[i * L + l] = offset;
        offset += g[i * L + l];
      }
    for (int64_t l = 0; l < L; ++l)
      for (int64_t i = 0; i < P; ++i)
        for (int64_t n = 0; n < g[i * L + l]; ++n) perm.push_back(start[i * L + l] + n);
    to_expert_major_ = at::from_blob(perm.data(), {static_cast<int64_t>(perm.size())}, at::kLong).to(tokens.device(), false, true);
    x = recv.index_select(0, to_expert_major_);
  }
  int64_t offset = 0;
  for (int64_t n : rows_per_expert_) {
    expert_inputs_.push_back(x.narrow(0, offset, n));
    offset += n;
  }
}

at::Tensor Dispatch::combine(const std::vector<at::Tensor>& outputs) const {
  if (static_cast<int64_t>(outputs.size()) != local_experts_)
    throw std::invalid_argument("tessera.moe: combine needs one output per local expert (" +
                                std::to_string(local_experts_) + "), got " + std::to_string(outputs.size()));
  at::Tensor back;
  if (capacity_ >= 0) {
    // Each [P·C, H'] as [P, C, H'], stacked along a new dim 1: [P, L, C, H'], rank i's rows of every
    // local expert together to go back to it, in one copy.
    const int64_t width = outputs.front().size(1);
    std::vector<at::Tensor> by_expert;
    for (const at::Tensor& o : outputs) by_expert.push_back(o.reshape({ranks_, capacity_, width}));
    at::Tensor by_rank = at::stack(by_expert, 1).view({-1, width});
    std::vector<int64_t> equal(ranks_, local_experts_ * capacity_);
    at::Tensor returned = group_ != nullptr ? all_to_all_rows(by_rank, *group_, equal, equal) : by_rank;
    back = returned.index_select(0, send_row_);
  } else {
    at::Tensor rows = at::cat(outputs, 0);
    if (to_expert_major_.defined()) {
      at::Tensor in_received_order = at::zeros_like(rows).index_copy(0, to_expert_major_, rows);
      rows = in_received_order;
    }
    back = group_ != nullptr ? all_to_all_rows(rows, *group_, recv_splits_, send_splits_) : rows;
  }
  at::Tensor weighted = back * weight_of_row_.to(back.scalar_type()).unsqueeze(1);
  return at::zeros({tokens_, back.size(1)}, back.options()).index_add(0, token_of_row_, weighted);
}

}  // namespace tessera
