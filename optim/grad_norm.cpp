#include "optim/grad_norm.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>

#include "parallel/communicator.h"

namespace tessera {

namespace {
bool spans(const Communicator* group) { return group && group->size() > 1; }
}  // namespace

at::Tensor gradient_norm(const at::Tensor& grads) {
  return at::linalg_vector_norm(grads, 2, c10::nullopt, false, at::kFloat);
}

double global_grad_sumsq(const std::vector<GradPart>& parts, const NormGroups& groups) {
  // Four partial sums by how the piece is split: [data-sharded × tensor-sharded, data-sharded ×
  // replicated, whole × tensor-sharded, whole × replicated]. Norms are stacked per kind, so a
  // model of one kind costs one stack and no per-parameter host reads.
  std::vector<at::Tensor> by_kind[4];
  for (const GradPart& p : parts)
    if (p.counted) by_kind[(p.data_sharded ? 0 : 2) + (p.tensor_sharded ? 0 : 1)].push_back(
        p.norm.defined() ? p.norm : gradient_norm(p.grads));
  const Communicator* any = groups.data ? groups.data : groups.tensor ? groups.tensor : groups.pipe;
  const auto options = parts.empty() ? at::TensorOptions().dtype(at::kDouble)
                                     : at::TensorOptions().dtype(at::kDouble).device(parts.front().grads.device());
  at::Tensor sums = at::zeros({4}, any ? any->options(at::kDouble) : options);
  for (int k = 0; k < 4; ++k)
    if (!by_kind[k].empty()) sums[k] = at::stack(by_kind[k]).to(at::kDouble).square_().sum();
  // Data-sharded pieces: the other ranks of the data group hold the rest of them.
  if (spans(groups.data) && (!by_kind[0].empty() || !by_kind[1].empty())) {
    at::Tensor sharded = sums.narrow(0, 0, 2).clone();
    groups.data->all_reduce(sharded);
    sums.narrow(0, 0, 2).copy_(sharded);
  }
  // Tensor-sharded pieces: the other ranks of the tensor group hold the other slices.
  at::Tensor tensor_part = (sums[0] + sums[2]).reshape({1});
  if (spans(groups.tensor)) groups.tensor->all_reduce(tensor_part);
  at::Tensor total = tensor_part + (sums[1] + sums[3]).reshape({1});
  // Pipeline stages hold disjoint layers.
  if (spans(groups.pipe)) groups.pipe->all_reduce(total);
  return total.item<double>();
}

double clip_coefficient(double grad_norm, double clip) {
  return clip > 0 && grad_norm > clip ? clip / (grad_norm + 1e-6) : 1.0;
}

}  // namespace tessera
