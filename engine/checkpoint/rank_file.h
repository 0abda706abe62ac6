// One rank's file of a checkpoint and its entry in metadata.json: what the engine's save
// (save.cpp) and an import from another framework (import_writer.h) both write.
//
//   RankFile      the tensors a file holds ("<state>/<param>", "group/...", "local/...", "rng/...")
//                 and, as JSON, the parameter pieces and group states it records; for an
//                 asynchronous save, its snapshot: the file's image in host memory (file_image.h)
//   write_rank_file  writes it (safetensors, fsynced) and returns its entry: checksums, bytes, pieces
//   merge         every file's entry into the metadata, each parameter's shards in element order
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/checkpoint/file_image.h"
#include "engine/checkpoint/metadata.h"
#include "engine/checkpoint/rank_state.h"

namespace tessera::checkpoint {

struct RankFile {
  NamedTensors tensors;  // on the host, contiguous (empty once `image` holds them)
  std::optional<FileImage> image;
  nlohmann::json params = nlohmann::json::array(), groups = nlohmann::json::array();
  int64_t bytes() const;  // of host memory the tensors (or the image) take
  // The tensors copied into the file's image, which `rank` will write (snapshot()'s memory is given
  // back when the file is written and the RankFile goes).
  void snapshot(int rank, const std::string& path);
  // Records elements [begin, begin + numel) of parameter `name` (its shape: a tensor-parallel
  // slice's own; the model's dtype as safetensors names it) as held by this file; the caller adds
  // its tensors.
  void add_piece(const std::string& name, const std::vector<int64_t>& shape, const std::string& dtype,
                 int pipeline_stage, int tensor_rank, const TensorSplit& split, int64_t begin, int64_t numel);
};

// The safetensors metadata of rank `rank`'s file.
std::map<std::string, std::string> rank_file_metadata(int rank);

// Writes `f` to `path` (the file `file` of the checkpoint, written by `rank`); returns its entry
// for the metadata.
nlohmann::json write_rank_file(const RankFile& f, const std::string& path, const std::string& file, int rank);

// Every file's entry (write_rank_file's, as text) merged into `m`.
Metadata merge(const std::vector<std::string>& entries, Metadata m);

}  // namespace tessera::checkpoint
