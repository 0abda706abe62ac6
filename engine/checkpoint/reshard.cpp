#include "engine/checkpoint/reshard.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/nonzero.h>

#include <stdexcept>

namespace tessera::checkpoint {

namespace {

// The sizes around the split dimension of a whole parameter, and a slice's share of it.
struct Cut {
  int64_t outer = 1, size = 1, inner = 1;  // before, along and after the split dimension
  int64_t block = 1, piece = 1, sliced = 1;  // a fused block; one rank's piece of it; the slice's size along it

  Cut(const std::vector<int64_t>& whole, TensorSplit split, int64_t ranks, const std::string& name) {
    const int64_t d = split.dim;
    for (int64_t i = 0; i < static_cast<int64_t>(whole.size()); ++i)
      (i < d ? outer : i == d ? size : inner) *= whole[i];
    if (d >= static_cast<int64_t>(whole.size()) || split.fused < 1 || size % (split.fused * ranks) != 0)
      throw std::runtime_error("tessera: checkpoint: " + name + " has " + std::to_string(size) + " entries along dimension " +
                               std::to_string(d) + ", which do not divide into " + std::to_string(split.fused) +
                               " fused block(s) over " + std::to_string(ranks) + " tensor rank(s)");
    block = size / split.fused;
    piece = block / ranks;
    sliced = split.fused * piece;
  }
};

}  // namespace

const ParameterRecord* SavedParameter::same_cut(int tensor_rank, int ranks, TensorSplit cut) const {
  if (tensor_rank < 0 || !cut.sharded()) return whole;
  if (static_cast<int>(slices.size()) != ranks) return nullptr;
  // A checkpoint that did not record its cut loads at its own degree, as it was saved.
  return split == cut || !split.sharded() ? slices[tensor_rank] : nullptr;
}

SavedParameters::SavedParameters(const Metadata& m) {
  for (const ParameterRecord& rec : m.parameters) {
    SavedParameter& p = by_name_[rec.name];
    p.name = rec.name;
    p.records.push_back(static_cast<size_t>(&rec - m.parameters.data()));
    if (rec.tensor_rank < 0) {
      if (!p.whole) p.whole = &rec;
      if (p.whole_shape.empty()) p.whole_shape = rec.shape;
      continue;
    }
    if (rec.tensor_rank >= m.layout.tensor_parallel)
      throw std::runtime_error("tessera: checkpoint: " + rec.name + " is listed at tensor rank " +
                               std::to_string(rec.tensor_rank) + " of a tensor-parallel degree of " +
                               std::to_string(m.layout.tensor_parallel));
    p.slices.resize(m.layout.tensor_parallel, nullptr);
    if (!p.slices[rec.tensor_rank]) p.slices[rec.tensor_rank] = &rec;
    p.split = rec.split;
    if (rec.split.sharded()) p.whole_shape = whole_shape_of(rec.shape, rec.split, m.layout.tensor_parallel);
  }
}

const SavedParameter* SavedParameters::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &it->second;
}

std::vector<int64_t> whole_shape_of(std::vector<int64_t> shape, TensorSplit split, int64_t ranks) {
  if (split.sharded() && split.dim < static_cast<int64_t>(shape.size())) shape[split.dim] *= ranks;
  return shape;
}

at::Tensor whole_indices(const std::vector<int64_t>& whole_shape, TensorSplit split, int64_t rank, int64_t ranks,
                         int64_t begin, int64_t numel) {
  at::Tensor pos = at::arange(begin, begin + numel, at::TensorOptions().dtype(at::kLong));
  if (!split.sharded() || ranks == 1) return pos;
  const Cut c(whole_shape, split, ranks, "a parameter");
  // Position in the slice -> (outer, along, inner) there -> along in the whole: the piece of this
  // rank in the same fused block.
  const at::Tensor k = pos.remainder(c.inner);
  const at::Tensor along = pos.div(c.inner, "floor").remainder(c.sliced);
  const at::Tensor o = pos.div(c.inner * c.sliced, "floor");
  const at::Tensor whole_along = along.div(c.piece, "floor") * c.block + rank * c.piece + along.remainder(c.piece);
  return (o * c.size + whole_along) * c.inner + k;
}

at::Tensor read_elements(CheckpointFiles& files, const SavedParameter& p, const std::string& state,
                         const at::Tensor& indices) {
  const int64_t n = indices.numel();
  // The covering range of `positions` (ascending) in record `rec`, then those elements.
  auto gather = [&](const ParameterRecord& rec, const at::Tensor& positions) {
    const int64_t lo = positions[0].item<int64_t>(), hi = positions[-1].item<int64_t>() + 1;
    const at::Tensor range = read_range(files, rec, state, lo, hi - lo);
    return hi - lo == positions.numel() ? range : range.index_select(0, positions - lo);
  };
  if (n == 0) return at::empty({0}, at::kFloat);
  if (p.whole) return gather(*p.whole, indices);
  if (!p.split.sharded())
    throw std::runtime_error("tessera: checkpoint: " + p.name + " was saved as tensor-parallel slices without their cut "
                             "(a checkpoint written before cuts were recorded): load it at its own tensor_parallel.tp_size");
  const int64_t ranks = static_cast<int64_t>(p.slices.size());
  for (int64_t r = 0; r < ranks; ++r)
    if (!p.slices[r])
      throw std::runtime_error("tessera: checkpoint: no file holds tensor rank " + std::to_string(r) + "'s slice of " + p.name);
  const Cut c(p.whole_shape, p.split, ranks, p.name);
  // Whole index -> (outer, along, inner) -> the rank whose piece of the fused block holds it, and
  // the position in that rank's slice.
  const at::Tensor k = indices.remainder(c.inner);
  const at::Tensor along = indices.div(c.inner, "floor").remainder(c.size);
  const at::Tensor o = indices.div(c.inner * c.size, "floor");
  const at::Tensor within = along.remainder(c.block);
  const at::Tensor owner = within.div(c.piece, "floor");
  const at::Tensor slice_along = along.div(c.block, "floor") * c.piece + within.remainder(c.piece);
  const at::Tensor position = (o * c.sliced + slice_along) * c.inner + k;
  at::Tensor out;
  for (int64_t r = 0; r < ranks; ++r) {
    const at::Tensor mine = at::nonzero(owner == r).view(-1);
    if (mine.numel() == 0) continue;
    const at::Tensor values = gather(*p.slices[r], position.index_select(0, mine));
    if (!out.defined()) out = at::empty({n}, values.options());
    out.index_copy_(0, mine, values);
  }
  return out;
}

}  // namespace tessera::checkpoint
