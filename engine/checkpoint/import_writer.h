// A tessera checkpoint written from another framework's saved state (`tessera checkpoint
// import-deepspeed`, python/tessera/deepspeed_checkpoint.py): the caller reads the other format
// and hands over, one source file at a time, the element ranges of whole parameters each held;
// ImportWriter writes them as that many rank files, then metadata.json, and commits the directory
// like a save (checkpoint_dir.h: a failure leaves no checkpoint and `latest` as it was). Since a
// tessera checkpoint loads at any layout (reshard.h), the ranges stay as the source cut them:
// nothing is concatenated, and the memory held is one source file's.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/checkpoint/metadata.h"
#include "engine/checkpoint/rank_state.h"

namespace tessera::checkpoint {

// Elements [begin, begin + numel) of one whole parameter, with every state of the layout.
struct ImportedPiece {
  std::string name;
  std::vector<int64_t> shape;  // the whole parameter's
  std::string dtype;           // the model's, as safetensors names it ("F32", "BF16", "F16")
  int64_t begin = 0;
  NamedTensors states;         // the layout's states in its order ("fp32", "exp_avg", ...): 1-D, numel each
};

class ImportWriter {
 public:
  // `layout`: what the source ran (its data-parallel size as world_size and data_parallel, its ZeRO
  // stage, optimizer, compute dtype) and the states each piece holds.
  ImportWriter(std::string save_dir, std::string tag, Layout layout);
  // Writes the next rank file (rank00000.safetensors, rank00001, ...) holding these pieces.
  void add_file(const std::vector<ImportedPiece>& pieces);
  // metadata.json with the engine's counters (Metadata::engine's fields) and client_state, checked
  // as a load checks it (every parameter covered exactly), then the commit. Returns the checkpoint's path.
  std::string commit(const nlohmann::json& engine, const nlohmann::json& client_state);

 private:
  std::string tag_;
  Layout layout_;
  std::unique_ptr<CheckpointWriter> writer_;
  std::vector<std::string> entries_;
  std::string path_;
};

}  // namespace tessera::checkpoint
