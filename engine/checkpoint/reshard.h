// Reading a parameter at another layout than it was saved in. A checkpoint holds each parameter
// either whole (tensor rank -1) or as the slices of the tensor-parallel degree it was saved at, on
// whichever pipeline stage held it; every element of those is an element of the whole parameter
// (tensor_parallel_slice's cut, recorded as "split"). A loading rank names the elements it owns now
// by their flat index in the whole parameter (whole_indices: its own slice at its own degree, then
// its data-parallel range of that), and read_elements fetches exactly those: for each saved record
// that holds some, the smallest range of its shards that covers them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/checkpoint/checkpoint_files.h"
#include "engine/checkpoint/metadata.h"
#include "parallel/tensor_parallel/tensor_split.h"

namespace tessera::checkpoint {

// One parameter as a checkpoint holds it, found by name on any pipeline stage (a weight tied across
// stages, saved by each, is the same values: the first stage's is used).
struct SavedParameter {
  std::string name;
  std::vector<int64_t> whole_shape;
  const ParameterRecord* whole = nullptr;      // saved whole, or
  std::vector<const ParameterRecord*> slices;  // one per tensor rank of the saved degree
  TensorSplit split;                           // the slices' cut
  std::vector<size_t> records;                 // every record of it in Metadata::parameters (each stage's)
  // The record that holds exactly what tensor rank `tensor_rank` of `ranks` cut by `split` holds
  // (dim -1: the whole parameter), or null when the elements must be gathered from others.
  const ParameterRecord* same_cut(int tensor_rank, int ranks, TensorSplit split) const;
};

class SavedParameters {
 public:
  // Throws naming the parameter when its slices do not cover every tensor rank of the saved degree,
  // or say nothing of their cut (a checkpoint written before cuts were recorded loads only at its
  // own tensor-parallel degree).
  explicit SavedParameters(const Metadata& m);
  const SavedParameter* find(const std::string& name) const;  // null: no stage saved it

 private:
  std::map<std::string, SavedParameter> by_name_;
};

// The whole parameter's shape from a slice's (`split.dim` times `ranks`; the slice's own when whole).
std::vector<int64_t> whole_shape_of(std::vector<int64_t> slice_shape, TensorSplit split, int64_t ranks);

// Flat indices into the whole parameter (int64) of elements [begin, begin + numel) of tensor rank
// `rank`'s slice of `ranks`, cut by `split` (dim -1: of the whole parameter itself).
at::Tensor whole_indices(const std::vector<int64_t>& whole_shape, TensorSplit split, int64_t rank, int64_t ranks,
                         int64_t begin, int64_t numel);

// State `state` ("fp32", "exp_avg", ...) of the whole parameter's elements `indices` (ascending, as
// whole_indices gives them), in that order, on the host in the stored dtype.
at::Tensor read_elements(CheckpointFiles& files, const SavedParameter& p, const std::string& state,
                         const at::Tensor& indices);

}  // namespace tessera::checkpoint
