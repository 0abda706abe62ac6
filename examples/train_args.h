// What the example training programs share: their flags and the data-parallel mean of a value.
//   --config FILE (required), --steps N optimizer steps (required), --seed S (1234),
//   --eval-every K (0: never), --checkpoint-activations (flag: recompute each block in backward,
//   Megatron's flag; the config's activation_checkpointing section sets how),
//   --save-parameters FILE (at the end, every parameter's single-device value, gathered from its
//   ZeRO partitions and tensor-parallel slices, written by rank 0: see write_parameters);
//   --save DIR (at the end, a checkpoint of the whole training state, docs/checkpoints.md) and
//   --load DIR (at the start, the latest checkpoint in DIR: training continues from its step up to
//   --steps; Megatron's flags);
//   train_gpt only: --n-layer, --n-head, --n-embd (the model's sizes; default 4, 4, 128), --seq-len
//   (the sequence length and block size; default 128) and
//   --timeline FILE (with pipeline stages: the last batch's instructions as run, JSON lines)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tessera {
class ParallelContext;
}

namespace tessera::examples {

struct TrainArgs {
  std::string config;
  int64_t steps = -1;
  uint64_t seed = 1234;
  int64_t eval_every = 0;
  bool checkpoint_activations = false;
  std::string save_parameters;  // empty: none
  std::string save, load;       // checkpoint directories; empty: none
  int64_t n_layer = 0, n_head = 0, n_embd = 0, seq_len = 0;  // 0: the program's default
  std::string timeline;         // empty: none
  bool gpt_only_flags() const {
    return n_layer || n_head || n_embd || seq_len || !timeline.empty() || checkpoint_activations || !save.empty() || !load.empty();
  }
};

// Parses argv; prints `usage` and exits 0 for -h/--help; throws std::invalid_argument otherwise.
TrainArgs parse_train_args(int argc, char** argv, const char* usage);

// Writes `tensors` to `path` as one flat run of little-endian float32 values, in order (what the
// tests compare between runs at different degrees); through a temporary file renamed into place.
void write_parameters(const std::string& path, const std::vector<at::Tensor>& tensors);

// The mean over the data-parallel ranks of a per-rank value (every rank must call it).
double data_parallel_mean(ParallelContext& ctx, double value);

}  // namespace tessera::examples
