#include "parallel/context_parallel/layout.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <c10/core/WrapDimMinimal.h>
#include <torch/csrc/autograd/custom_function.h>

#include <stdexcept>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/tensor_parallel/regions.h"

namespace tessera {

namespace {

// The global chunk indices a rank holds, in the order it holds them.
std::vector<int64_t> chunks_of(const ContextLayout& l) {
  if (!l.balanced) return {l.rank};
  return {l.rank, 2 * l.ranks - 1 - l.rank};
}

void check_divides(int64_t length, const ContextLayout& l) {
  if (length % l.chunks() != 0)
    throw std::invalid_argument(
        "tessera: context parallelism: a sequence of length " + std::to_string(length) +
        " does not divide over context_parallel.size " + std::to_string(l.ranks) +
        (l.balanced ? " (ring attention cuts it into 2 x " + std::to_string(l.ranks) + " = " +
                          std::to_string(l.chunks()) + " chunks)"
                    : std::string()) +
        "; pad it to a multiple of " + std::to_string(l.chunks()) + " (tessera.sequence.pad_for_context)");
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct ContextMean : torch::autograd::Function<ContextMean> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& local_sum, const at::Tensor& local_count,
                            int64_t comm) {
    Communicator& group = communicator_of(comm);
    at::Tensor both = at::stack({local_sum.detach().to(at::kDouble).reshape({}),
                                 local_count.detach().to(at::kDouble).reshape({})})
                          .to(group.device());
    if (group.size() > 1) group.all_reduce(both);
    const double count = both[1].item<double>();
    if (!(count > 0)) throw std::invalid_argument("tessera: context_mean: no tokens counted on any context rank");
    ctx->saved_data["scale"] = double(group.size()) / count;
    return (both[0] / count).to(local_sum.scalar_type()).to(local_sum.device());
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {g[0] * ctx->saved_data["scale"].toDouble(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

ContextLayout context_layout(const std::string& method, int64_t ranks, int64_t rank) {
  if (method != "ring" && method != "ulysses")
    throw std::invalid_argument("tessera: context_parallel.method must be \"ulysses\" or \"ring\", got \"" + method + "\"");
  if (ranks < 1 || rank < 0 || rank >= ranks)
    throw std::invalid_argument("tessera: context layout: rank " + std::to_string(rank) + " of " + std::to_string(ranks));
  return ContextLayout{ranks, rank, method == "ring"};
}

int64_t context_padding(int64_t length, const ContextLayout& layout) {
  return (layout.chunks() - length % layout.chunks()) % layout.chunks();
}

at::Tensor context_shard(const at::Tensor& x, int64_t dim, const ContextLayout& layout) {
  dim = c10::maybe_wrap_dim(dim, x.dim());
  const int64_t length = x.size(dim);
  check_divides(length, layout);
  const int64_t chunk = length / layout.chunks();
  std::vector<at::Tensor> parts;
  for (int64_t c : chunks_of(layout)) parts.push_back(x.narrow(dim, c * chunk, chunk));
  return parts.size() == 1 ? parts[0].clone(at::MemoryFormat::Contiguous) : at::cat(parts, dim);
}

at::Tensor context_positions(int64_t length, const ContextLayout& layout, c10::Device device) {
  check_divides(length, layout);
  const int64_t chunk = length / layout.chunks();
  std::vector<at::Tensor> parts;
  for (int64_t c : chunks_of(layout)) parts.push_back(at::arange(c * chunk, (c + 1) * chunk, at::kLong));
  return (parts.size() == 1 ? parts[0] : at::cat(parts)).to(device);
}

at::Tensor context_unshard(const at::Tensor& part, Communicator& context, int64_t dim, const ContextLayout& layout) {
  dim = c10::maybe_wrap_dim(dim, part.dim());
  const int64_t n = context.size();
  if (n != layout.ranks) throw std::invalid_argument("tessera: context_unshard: the layout is for " +
                                                     std::to_string(layout.ranks) + " ranks, the group has " + std::to_string(n));
  at::Tensor mine = part.detach().contiguous();
  at::Tensor all = at::empty({n * mine.numel()}, mine.options());
  if (n > 1) context.all_gather(mine.view(-1), all);
  else all.copy_(mine.view(-1));
  std::vector<int64_t> shape{n};
  for (int64_t s : mine.sizes()) shape.push_back(s);
  at::Tensor by_rank = all.view(shape);  // [rank, ...part...]
  const int64_t per_chunk = part.size(dim) / (layout.balanced ? 2 : 1);
  std::vector<at::Tensor> chunk(layout.chunks());
  for (int64_t r = 0; r < n; ++r) {
    const std::vector<int64_t> held = chunks_of(ContextLayout{n, r, layout.balanced});
    for (size_t i = 0; i < held.size(); ++i) chunk[held[i]] = by_rank[r].narrow(dim, i * per_chunk, per_chunk);
  }
  return at::cat(chunk, dim);
}

at::Tensor context_mean(const at::Tensor& local_sum, const at::Tensor& local_count, Communicator& context) {
  return ContextMean::apply(local_sum, local_count, communicator_handle(context));
}

}  // namespace tessera
