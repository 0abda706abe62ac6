// The crossings between the replicated part of a model and its tensor-parallel regions, each an
// autograd function with one collective on the tensor group (forward or backward, never both).
//
// Megatron-LM (Shoeybi et al. 2019, §3, Fig. 3) names two: f before a column-parallel layer
// (identity forward, all-reduce backward) and g after a row-parallel one (all-reduce forward,
// identity backward), so an MLP Y = GeLU(X·A)·B with A split by columns and B by rows costs one
// all-reduce each way. Sequence parallelism (Korthikanti et al. 2022, §4.2.2) replaces g by a
// reduce-scatter along the sequence and f by an all-gather (their g and ḡ): the same bytes as one
// all-reduce, and the layers between (LayerNorm, dropout, residual adds) see 1/t of the sequence.
//
//   copy_to_tensor_region                 identity        | all-reduce       (f)
//   reduce_from_tensor_region             all-reduce      | identity         (g)
//   gather_from_sequence_region           all-gather(dim) | reduce-scatter   (SP's f: the output is
//                                                                            read by split layers)
//   reduce_scatter_to_sequence_region     reduce-scatter  | all-gather       (SP's g)
//   scatter_to_sequence_region            keep own slice  | all-gather       (into the SP region)
//   gather_from_tensor_region             all-gather(dim) | keep own slice   (a column-parallel output
//                                                                            made whole, or the sequence
//                                                                            leaving the SP region for
//                                                                            a replicated computation)
//
// Every tensor rank must call the same crossings in the same order (they are collectives). With a
// tensor group of one rank each is the identity. `dim` is where the sequence (or the split
// features) lies; its size must divide evenly by the group's size (an error names both).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace tessera {

class Communicator;

at::Tensor copy_to_tensor_region(const at::Tensor& x, Communicator& tensor);
at::Tensor reduce_from_tensor_region(const at::Tensor& x, Communicator& tensor);
at::Tensor gather_from_sequence_region(const at::Tensor& x, Communicator& tensor, int64_t dim);
at::Tensor reduce_scatter_to_sequence_region(const at::Tensor& x, Communicator& tensor, int64_t dim);
at::Tensor scatter_to_sequence_region(const at::Tensor& x, Communicator& tensor, int64_t dim);
at::Tensor gather_from_tensor_region(const at::Tensor& x, Communicator& tensor, int64_t dim);

// The collectives themselves, outside autograd (the functions above call them; so do layers that
// write their own backward). `dim` as above.
at::Tensor all_gather_along(const at::Tensor& x, Communicator& tensor, int64_t dim);
at::Tensor reduce_scatter_along(const at::Tensor& x, Communicator& tensor, int64_t dim);
at::Tensor slice_along(const at::Tensor& x, Communicator& tensor, int64_t dim);  // this rank's slice, a copy
at::Tensor all_reduced(const at::Tensor& x, Communicator& tensor);               // a reduced copy

// A whole (single-device) tensor cut to rank `rank` of `ranks`'s part, so that a tensor-parallel
// model built from a seed holds exactly the single-device model's values: `dim` is split; with
// `fused` > 1 the dimension is that many equal blocks (a fused q|k|v projection) and each block is
// split, this rank's pieces concatenated. `what` names the tensor in the error when a size does not
// divide. slice_along is this for the group's own rank.
at::Tensor tensor_parallel_slice(const at::Tensor& whole, int64_t rank, int64_t ranks, int64_t dim,
                                 int64_t fused = 1, const std::string& what = "a tensor");
// The inverse, a collective: every tensor rank's slice gathered into the whole tensor (for
// comparing, saving or evaluating a tensor-parallel model at another degree). Outside autograd.
at::Tensor tensor_parallel_whole(const at::Tensor& slice, Communicator& tensor, int64_t dim, int64_t fused = 1);

// How an autograd function carries the communicator in its context (an integer; the
// ParallelContext owns the communicator for the whole job, so it outlives every graph).
int64_t communicator_handle(Communicator& c);
Communicator& communicator_of(int64_t handle);

}  // namespace tessera
