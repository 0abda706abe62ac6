// Activation checkpointing for models written with ATen ops (the C++ counterpart of
// python/tessera/checkpointing.py, DeepSpeed's deepspeed.checkpointing).
//
// checkpoint(fn, inputs) runs fn without keeping its intermediate activations: forward keeps only
// `inputs`, backward runs fn again with gradients on, from the random state it had the first time
// (dropout draws the same masks; the caller's generators are left where they were), and
// back-propagates through that (Chen et al. 2016: n blocks' activations cost their inputs plus one
// block's, for one more forward). Parameters read inside fn get their gradients through that
// second run; the outputs require grad even when no input does.
//
// It lives in parallel/ because of partition_activations: with a tensor group of t ranks, whose
// inputs are equal on all of them (no sequence parallelism), each rank keeps 1/t of every input and
// the recomputation all-gathers it.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace tessera {

class Communicator;

struct CheckpointOptions {
  Communicator* partition_over = nullptr;  // partition_activations: the tensor group (null: keep whole)
  bool cpu = false;                        // cpu_checkpointing: kept inputs wait in host memory
};

using CheckpointedFunction = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

std::vector<at::Tensor> checkpoint(CheckpointedFunction fn, const std::vector<at::Tensor>& inputs,
                                   const CheckpointOptions& options = {});

// How many recomputations have run in this process (for tests and progress lines).
int64_t checkpoint_recomputations();

}  // namespace tessera
