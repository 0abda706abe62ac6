#include "parallel/tensor_parallel/regions.h"

#include <ATen/WrapDimUtils.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/custom_function.h>

#include <stdexcept>
#include <string>

#include "parallel/communicator.h"

namespace tessera {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

Communicator& comm_of(AutogradContext* ctx) { return communicator_of(ctx->saved_data["comm"].toInt()); }

int64_t split_dim(const at::Tensor& x, Communicator& tensor, int64_t dim, const char* what) {
  dim = at::maybe_wrap_dim(dim, x.dim());
  if (x.size(dim) % tensor.size() != 0)
    throw std::invalid_argument(std::string("tessera: ") + what + ": dimension " + std::to_string(dim) + " of a tensor of shape " +
                                c10::str(x.sizes()) + " (" + std::to_string(x.size(dim)) +
                                ") does not divide evenly over the " + std::to_string(tensor.size()) +
                                " ranks of the tensor group; make it a multiple of tensor_parallel.tp_size");
  return dim;
}

// Each function: forward(ctx, x, comm, dim) and its backward, one collective on one side.
struct CopyToRegion : torch::autograd::Function<CopyToRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {all_reduced(g[0], comm_of(ctx)), at::Tensor()};
  }
};

struct ReduceFromRegion : torch::autograd::Function<ReduceFromRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm) {
    return all_reduced(x, communicator_of(comm));
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) { return {g[0], at::Tensor()}; }
};

// Forward `Fwd`, backward `Bwd`, both along `dim`.
template <at::Tensor (*Fwd)(const at::Tensor&, Communicator&, int64_t),
          at::Tensor (*Bwd)(const at::Tensor&, Communicator&, int64_t)>
struct AlongDim : torch::autograd::Function<AlongDim<Fwd, Bwd>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm, int64_t dim) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["dim"] = dim;
    return Fwd(x, communicator_of(comm), dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {Bwd(g[0], comm_of(ctx), ctx->saved_data["dim"].toInt()), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor all_gather_along(const at::Tensor& x, Communicator& tensor, int64_t dim) {
  dim = at::maybe_wrap_dim(dim, x.dim());
  const int n = tensor.size();
  if (n == 1) return x;
  at::Tensor mine = x.contiguous();
  at::Tensor flat = at::empty({n * mine.numel()}, mine.options());
  tensor.all_gather(mine.view(-1), flat);
  std::vector<int64_t> parts_shape{n};
  for (int64_t s : mine.sizes()) parts_shape.push_back(s);
  std::vector<int64_t> whole = mine.sizes().vec();
  whole[dim] *= n;
  // [n, ..., s, ...] -> [..., n, s, ...] -> [..., n·s, ...]: rank r's slice lands at r·s.
  return flat.view(parts_shape).movedim(0, dim).reshape(whole);
}

at::Tensor reduce_scatter_along(const at::Tensor& x, Communicator& tensor, int64_t dim) {
  dim = split_dim(x, tensor, dim, "reduce-scatter along a dimension");
  const int n = tensor.size();
  if (n == 1) return x;
  std::vector<int64_t> split = x.sizes().vec();
  split[dim] /= n;
  std::vector<int64_t> mine_shape = split;
  split.insert(split.begin() + dim, n);
  // [..., n·s, ...] -> [..., n, s, ...] -> [n, ..., s, ...], flat: rank r's slice is chunk r.
  at::Tensor flat = x.reshape(split).movedim(dim, 0).contiguous().view(-1);
  const int64_t chunk = flat.numel() / n;
  at::Tensor mine = flat.narrow(0, tensor.rank() * chunk, chunk);
  tensor.reduce_scatter(flat, mine);
  return mine.clone().view(mine_shape);  // not a view holding the whole buffer alive
}

at::Tensor slice_along(const at::Tensor& x, Communicator& tensor, int64_t dim) {
  return tensor_parallel_slice(x, tensor.rank(), tensor.size(), dim, 1, "a tensor of shape " + c10::str(x.sizes()));
}

at::Tensor tensor_parallel_slice(const at::Tensor& whole, int64_t rank, int64_t ranks, int64_t dim, int64_t fused,
                                 const std::string& what) {
  dim = at::maybe_wrap_dim(dim, whole.dim());
  const int64_t size = whole.size(dim);
  if (fused < 1 || size % (fused * ranks) != 0)
    throw std::invalid_argument("tessera: tensor parallelism: " + what + " has " + std::to_string(size) +
                                " entries along dimension " + std::to_string(dim) +
                                (fused > 1 ? " (" + std::to_string(fused) + " fused blocks)" : std::string()) +
                                ", which does not divide evenly over tensor_parallel.tp_size = " +
                                std::to_string(ranks));
  const int64_t block = size / fused, piece = block / ranks;
  if (fused == 1) return whole.narrow(dim, rank * piece, piece).clone(at::MemoryFormat::Contiguous);
  std::vector<at::Tensor> pieces;
  for (int64_t f = 0; f < fused; ++f) pieces.push_back(whole.narrow(dim, f * block + rank * piece, piece));
  return at::cat(pieces, dim);
}

at::Tensor tensor_parallel_whole(const at::Tensor& slice, Communicator& tensor, int64_t dim, int64_t fused) {
  const int64_t ranks = tensor.size();
  dim = at::maybe_wrap_dim(dim, slice.dim());
  at::Tensor gathered = all_gather_along(slice.detach().contiguous(), tensor, dim);  // [rank 0's | rank 1's | ...]
  if (fused == 1 || ranks == 1) return gathered;
  // Rank r holds [block 0's piece r | block 1's piece r | ...]: reorder to [block 0 | block 1 | ...].
  const int64_t piece = slice.size(dim) / fused;
  std::vector<at::Tensor> pieces;
  for (int64_t f = 0; f < fused; ++f)
    for (int64_t r = 0; r < ranks; ++r) pieces.push_back(gathered.narrow(dim, r * slice.size(dim) + f * piece, piece));
  return at::cat(pieces, dim);
}

int64_t communicator_handle(Communicator& c) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(&c)); }
Communicator& communicator_of(int64_t handle) { return *reinterpret_cast<Communicator*>(static_cast<intptr_t>(handle)); }

at::Tensor all_reduced(const at::Tensor& x, Communicator& tensor) {
  if (tensor.size() == 1) return x;
  at::Tensor out = x.clone(at::MemoryFormat::Contiguous);
  tensor.all_reduce(out);
  return out;
}

at::Tensor copy_to_tensor_region(const at::Tensor& x, Communicator& tensor) {
  return tensor.size() == 1 ? x : CopyToRegion::apply(x, communicator_handle(tensor));
}

at::Tensor reduce_from_tensor_region(const at::Tensor& x, Communicator& tensor) {
  return tensor.size() == 1 ? x : ReduceFromRegion::apply(x, communicator_handle(tensor));
}

at::Tensor gather_from_sequence_region(const at::Tensor& x, Communicator& tensor, int64_t dim) {
  return tensor.size() == 1 ? x : AlongDim<all_gather_along, reduce_scatter_along>::apply(x, communicator_handle(tensor), dim);
}

at::Tensor reduce_scatter_to_sequence_region(const at::Tensor& x, Communicator& tensor, int64_t dim) {
  if (tensor.size() == 1) return x;
  split_dim(x, tensor, dim, "reduce_scatter_to_sequence_region");
  return AlongDim<reduce_scatter_along, all_gather_along>::apply(x, communicator_handle(tensor), dim);
}

at::Tensor scatter_to_sequence_region(const at::Tensor& x, Communicator& tensor, int64_t dim) {
  if (tensor.size() == 1) return x;
  split_dim(x, tensor, dim, "scatter_to_sequence_region");
  return AlongDim<slice_along, all_gather_along>::apply(x, communicator_handle(tensor), dim);
}

at::Tensor gather_from_tensor_region(const at::Tensor& x, Communicator& tensor, int64_t dim) {
  return tensor.size() == 1 ? x : AlongDim<all_gather_along, slice_along>::apply(x, communicator_handle(tensor), dim);
}

}  // namespace tessera
