#include "parallel/moe/dispatch.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/from_blob.h>
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

// A reordering of the rows of a [N, H] tensor whose backward is the inverse reordering: one gather
// each way (index_select's own backward would scatter-add into a zeroed tensor).
struct PermuteRows : torch::autograd::Function<PermuteRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rows, const at::Tensor& order,
                            const at::Tensor& inverse) {
    ctx->save_for_backward({inverse});
    return rows.index_select(0, order);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {g[0].index_select(0, ctx->get_saved_variables()[0]), at::Tensor(), at::Tensor()};
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
  if (experts_ % ranks_ != 0)
    throw std::invalid_argument("tessera.moe: num_experts " + std::to_string(experts_) + " does not divide over the " +
                                std::to_string(ranks_) + " ranks of the expert-parallel " + group_->describe());
  local_experts_ = experts_ / ranks_;
  first_expert_ = (group_ != nullptr ? group_->rank() : 0) * local_experts_;
  const int64_t P = ranks_, L = local_experts_;

  // Kept choices per expert: every choice dropless, at most the capacity with one. An expert's kept
  // choices have the slots 0, 1, ... (gating.h), so a choice's row in the send buffer is its
  // expert's offset plus its slot: grouped by expert, in priority order within one.
  at::Tensor counts = r.exp_counts.to(at::kLong).contiguous();
  if (r.capacity >= 0) counts = counts.clamp_max(r.capacity);
  const int64_t* count = counts.data_ptr<int64_t>();
  at::Tensor offsets = counts.cumsum(0).sub(counts);
  const int64_t rows = std::accumulate(count, count + experts_, int64_t(0));
  at::Tensor choice = r.kept.reshape(-1).nonzero().view(-1);  // flat indices into [T, k]
  if (choice.numel() != rows)
    throw std::logic_error("tessera.moe: the routing keeps " + std::to_string(choice.numel()) +
                           " choices but its counts and capacity say " + std::to_string(rows));
  at::Tensor row = offsets.to(choice.device()).index_select(0, r.expert.reshape(-1).index_select(0, choice)) +
                   r.slot.reshape(-1).index_select(0, choice);
  at::Tensor choice_of_row = at::empty_like(choice).index_copy_(0, row, choice);
  token_of_row_ = choice_of_row.div(r.k, "floor");
  weight_of_row_ = r.weight.reshape(-1).index_select(0, choice_of_row);
  send_splits_.assign(P, 0);
  for (int64_t e = 0; e < experts_; ++e) send_splits_[e / L] += count[e];
  at::Tensor send = tokens.index_select(0, token_of_row_);
  if (group_ == nullptr) {
    rows_per_expert_.assign(count, count + experts_);
    recv_splits_ = send_splits_;
    expert_inputs_ = send.split_with_sizes(rows_per_expert_);
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
  at::Tensor x = all_to_all_rows(send, *group_, send_splits_, recv_splits_);
  if (L > 1) {
    // Received rows are [from rank][local expert]; each expert wants its rows together.
    std::vector<int64_t> start(P * L), order;
    order.reserve(total(recv_splits_));
    for (int64_t i = 0, offset = 0; i < P; ++i)
      for (int64_t l = 0; l < L; ++l) {
        start[i * L + l] = offset;
        offset += g[i * L + l];
      }
    for (int64_t l = 0; l < L; ++l)
      for (int64_t i = 0; i < P; ++i)
        for (int64_t n = 0; n < g[i * L + l]; ++n) order.push_back(start[i * L + l] + n);
    std::vector<int64_t> inverse(order.size());
    for (size_t n = 0; n < order.size(); ++n) inverse[order[n]] = static_cast<int64_t>(n);
    const auto as_tensor = [&](std::vector<int64_t>& v) {
      return at::from_blob(v.data(), {static_cast<int64_t>(v.size())}, at::kLong).to(tokens.device(), false, true);
    };
    to_expert_major_ = as_tensor(order);
    from_expert_major_ = as_tensor(inverse);
    x = PermuteRows::apply(x, to_expert_major_, from_expert_major_);
  }
  expert_inputs_ = x.split_with_sizes(rows_per_expert_);
}

at::Tensor Dispatch::combine(const std::vector<at::Tensor>& outputs) const {
  if (static_cast<int64_t>(outputs.size()) != local_experts_)
    throw std::invalid_argument("tessera.moe: combine needs one output per local expert (" +
                                std::to_string(local_experts_) + "), got " + std::to_string(outputs.size()));
  for (int64_t l = 0; l < local_experts_; ++l)
    if (outputs[l].dim() != 2 || outputs[l].size(0) != rows_per_expert_[l])
      throw std::invalid_argument("tessera.moe: local expert " + std::to_string(l) + " got " +
                                  std::to_string(rows_per_expert_[l]) + " rows but returned " +
                                  c10::str(outputs[l].sizes()) + " (an expert maps each row to one row)");
  at::Tensor rows = local_experts_ == 1 ? outputs.front() : at::cat(outputs, 0);
  if (from_expert_major_.defined()) rows = PermuteRows::apply(rows, from_expert_major_, to_expert_major_);
  at::Tensor back = group_ != nullptr ? all_to_all_rows(rows, *group_, recv_splits_, send_splits_) : rows;
  at::Tensor weighted = back * weight_of_row_.to(back.scalar_type()).unsqueeze(1);
  return at::zeros({tokens_, back.size(1)}, back.options()).index_add(0, token_of_row_, weighted);
}

}  // namespace tessera
