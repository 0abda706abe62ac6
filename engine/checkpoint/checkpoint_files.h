// Reading a saved checkpoint's tensors, each checked against the metadata (its checksum, its
// file's size, its length): what the engine's load, `tessera checkpoint export` and `inspect` share.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>

#include "engine/checkpoint/metadata.h"
#include "engine/checkpoint/safetensors.h"

namespace tessera::checkpoint {

class CheckpointFiles {
 public:
  CheckpointFiles(std::string dir, const Metadata& m) : dir_(std::move(dir)), m_(m) {}
  // Tensor `tensor` of `file`, whole, on the host: its checksum and the file's size verified.
  at::Tensor read(const std::string& file, const std::string& tensor);
  bool lists(const std::string& file, const std::string& tensor) const;

 private:
  SafetensorsReader& open(const std::string& path, const FileRecord& rec);

  std::string dir_;
  const Metadata& m_;
  std::map<std::string, std::unique_ptr<SafetensorsReader>> readers_;
};

// Elements [begin, begin + numel) of parameter `p`'s state `state` ("fp32", "exp_avg", ...), from
// the shards that hold them, on the host in the stored dtype.
at::Tensor read_range(CheckpointFiles& files, const ParameterRecord& p, const std::string& state, int64_t begin,
                      int64_t numel);

}  // namespace tessera::checkpoint
