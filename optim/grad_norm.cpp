#include "optim/grad_norm.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>

#include <cmath>
#include <stdexcept>

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
  std::vector<at::Tensor> own_groups;  // parts on groups of their own, each ‖g‖ / √copies
  for (const GradPart& p : parts) {
    if (!p.counted) continue;
    at::Tensor norm = p.norm.defined() ? p.norm : gradient_norm(p.grads);
    if (p.group && p.group != groups.data) {
      const int tensor_copies = p.tensor_sharded || !groups.tensor ? 1 : groups.tensor->size();
      const int copies = (p.data_sharded ? 1 : p.group->size()) * tensor_copies;
      own_groups.push_back(copies == 1 ? norm : norm / std::sqrt(double(copies)));
      continue;
    }
    by_kind[(p.data_sharded ? 0 : 2) + (p.tensor_sharded ? 0 : 1)].push_back(norm);
  }
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
  // With `world` set every rank takes part, holding such parts or not (a pipeline stage may have none).
  if (!own_groups.empty() && !groups.world)
    throw std::logic_error("tessera: a gradient part on a group of its own needs NormGroups::world");
  if (groups.world) {
    at::Tensor own = at::zeros({1}, total.options());
    if (!own_groups.empty()) own += at::stack(own_groups).to(at::kDouble).square_().sum().to(total.device());
    if (spans(groups.world)) groups.world->all_reduce(own);
    total = total + own;
  }
  return total.item<double>();
}

double clip_coefficient(double grad_norm, double clip) {
  return clip > 0 && grad_norm > clip ? clip / (grad_norm + 1e-6) : 1.0;
}

}  // namespace tessera
