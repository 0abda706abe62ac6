// PartitionedInit: building a ZeRO-3 model without the whole model on any rank (DeepSpeed's
// zero.Init; tessera.zero.Init in Python wraps this object).
//
// The model hands each piece to partition() as soon as the piece is built (a layer: the Python
// context manager does it at the end of every module's __init__, the C++ GPT after each block):
// data-parallel rank 0's values are broadcast (one collective per call, so every rank starts from
// the same model whatever its seed), this rank keeps its CHUNK of each parameter, and the tensor
// itself keeps its shape, dtype and requires_grad but holds no bytes: it reads as NaN, like a
// released ZeRO-3 parameter. Peak memory while building is the chunks so far plus one piece.
//
// Chunk r of a parameter of n elements on N ranks: elements [r·c, min((r+1)·c, n)) of its
// flattened values, c = ceil(n / N), zero-padded to c elements (kept in the parameter's dtype).
//
// The engine takes the chunks (take_shards fills ParamGroup::shards) and builds its own flat
// buffers from them bucket by bucket (ZeroOptimizer's construction: one allgather of the bucket's
// chunks, never the whole model). gather()/release() make some parameters whole for a while
// before there is an engine (tessera.zero.GatheredParameters: custom initialization).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "parallel/communicator.h"
#include "zero/model.h"

namespace tessera {

class PartitionedInit {
 public:
  explicit PartitionedInit(Communicator& data) : data_(data) {}

  // Collective over the data group, every rank with the same parameters (in order and shapes).
  // Parameters partitioned already are skipped.
  void partition(const std::vector<at::Tensor>& params);
  // Whether `param` was partitioned here and its chunk not taken yet.
  bool holds(const at::Tensor& param) const;
  // The chunks of `params` gathered: each parameter whole again (collective; those this object
  // does not hold are skipped). Gathers nest: a parameter stays whole until its last release.
  void gather(const std::vector<at::Tensor>& params);
  // Undoes one gather() of each parameter of `params`: with root >= 0 the values data-parallel
  // rank `root` holds now become every rank's chunks (its modifications count, DeepSpeed's
  // modifier_rank), otherwise the chunks stay as they were; a parameter whose last gather this
  // undoes gives up its bytes again. Collective.
  void release(const std::vector<at::Tensor>& params, int root);
  // Moves the chunk of every parameter of `model` held here into its group's `shards` (the
  // engine's input); they are not held here afterwards. Throws, moving nothing, when one of them
  // is gathered (inside a GatheredParameters block).
  void take_shards(ModelDescription& model);
  int64_t held_bytes() const;  // the chunks held now
  int64_t held_parameters() const;

 private:
  struct Entry {
    explicit Entry(const at::Tensor& p) : param(p.getIntrusivePtr()) {}
    c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> param;  // dropped parameters free their chunk
    at::Tensor chunk;
    int gathered = 0;  // open gather()s
  };
  std::vector<Entry*> entries_of(const std::vector<at::Tensor>& params);
  void forget_dropped();

  Communicator& data_;
  std::unordered_map<const void*, Entry> entries_;  // TensorImpl* -> its chunk
};

// A tensor of `shape` that holds no bytes and reads as NaN (one element, expanded).
at::Tensor released_placeholder(at::IntArrayRef shape, const at::TensorOptions& options);

// Chunk size of a parameter of n elements partitioned over `ranks` (ceil(n / ranks)).
inline int64_t init_chunk_numel(int64_t n, int ranks) { return (n + ranks - 1) / ranks; }

}  // namespace tessera
