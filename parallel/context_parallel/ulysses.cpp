#include "parallel/context_parallel/ulysses.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/stack.h>
#include <c10/core/WrapDimMinimal.h>
#include <torch/csrc/autograd/custom_function.h>

#include <stdexcept>
#include <string>

#include "parallel/communicator.h"
#include "parallel/tensor_parallel/regions.h"

namespace tessera {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Splits `x` along `split_dim` into N parts, part j to rank j; concatenates what arrives along
// `join_dim` in rank order. Both directions of Ulysses are this with the dimensions swapped.
at::Tensor exchange(const at::Tensor& x, Communicator& group, int64_t split_dim, int64_t join_dim) {
  const int n = group.size();
  if (n == 1) return x;
  at::Tensor send = at::stack(x.chunk(n, split_dim), 0);  // [N, ...]: part j for rank j, one copy
  at::Tensor recv = at::empty_like(send);
  group.all_to_all(send.view(-1), recv);
  return at::cat(recv.unbind(0), join_dim);
}

struct Exchange : torch::autograd::Function<Exchange> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm, int64_t split_dim,
                            int64_t join_dim) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["split"] = split_dim;
    ctx->saved_data["join"] = join_dim;
    return exchange(x, communicator_of(comm), split_dim, join_dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {exchange(g[0], communicator_of(ctx->saved_data["comm"].toInt()), ctx->saved_data["join"].toInt(),
                     ctx->saved_data["split"].toInt()),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

void check_dims(const at::Tensor& x, int64_t& seq_dim, int64_t& head_dim) {
  seq_dim = c10::maybe_wrap_dim(seq_dim, x.dim());
  head_dim = c10::maybe_wrap_dim(head_dim, x.dim());
  if (seq_dim == head_dim)
    throw std::invalid_argument("tessera: Ulysses: the sequence and head dimensions are the same (" +
                                std::to_string(seq_dim) + ")");
}

}  // namespace

void check_ulysses_heads(int64_t heads, int64_t ranks) {
  if (ranks > 1 && heads % ranks != 0)
    throw std::invalid_argument(
        "tessera: Ulysses context parallelism splits the attention heads over the context group: " +
        std::to_string(heads) + " heads (per tensor-parallel rank) are not divisible by context_parallel.size " +
        std::to_string(ranks) + "; use context_parallel.method \"ring\", which takes any number of heads");
}

at::Tensor sequence_to_heads(const at::Tensor& x, Communicator& context, int64_t seq_dim, int64_t head_dim) {
  check_dims(x, seq_dim, head_dim);
  check_ulysses_heads(x.size(head_dim), context.size());
  if (context.size() == 1) return x;
  return Exchange::apply(x, communicator_handle(context), head_dim, seq_dim);
}

at::Tensor heads_to_sequence(const at::Tensor& x, Communicator& context, int64_t seq_dim, int64_t head_dim) {
  check_dims(x, seq_dim, head_dim);
  if (context.size() > 1 && x.size(seq_dim) % context.size() != 0)
    throw std::invalid_argument("tessera: Ulysses: a whole sequence of " + std::to_string(x.size(seq_dim)) +
                                " positions does not split over context_parallel.size " + std::to_string(context.size()));
  if (context.size() == 1) return x;
  return Exchange::apply(x, communicator_handle(context), seq_dim, head_dim);
}

}  // namespace tessera
