// What `tessera checkpoint export` and `tessera checkpoint inspect` do, without the training
// processes (DeepSpeed's zero_to_fp32.py, and a checker it lacks):
//
//   export   every parameter whole, under the module's own names, from the ranges the ranks
//            saved: one safetensors file, or several of at most max_shard_bytes plus an index
//            (Hugging Face's model.safetensors.index.json) when the model is larger; with --hf, a
//            directory from_pretrained loads (the weights and the config.json of a transformers
//            model, which the Python engine records in the checkpoint)
//   inspect  the tags in a save directory, the layout and counters of one, its parameters and
//            files, and every tensor's checksum verified
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::checkpoint {

struct ExportOptions {
  std::string dir;       // the save directory (or a checkpoint directory itself)
  std::string tag;       // empty: latest
  std::string output;    // model.safetensors; with hf, a directory
  // A Hugging Face model directory: output/model.safetensors (or its shards and index) and
  // output/config.json from the checkpoint's hf_config, which from_pretrained(output) loads.
  bool hf = false;
  std::string dtype = "fp32";  // fp32, bf16 or fp16
  int64_t max_shard_bytes = 5'000'000'000;
};

struct ExportResult {
  std::string checkpoint;            // the directory read
  std::vector<std::string> files;    // written (the index last, when there is one)
  int64_t parameters = 0, elements = 0, bytes = 0;
  double seconds = 0;
};

ExportResult export_checkpoint(const ExportOptions& options);

// "5GB", "500MB", "1.5GiB", "1000000" -> bytes; std::invalid_argument otherwise.
int64_t parse_size(const std::string& text);

// The report `tessera checkpoint inspect` prints; `ok` false when a file fails its check.
struct InspectReport {
  std::string text;
  bool ok = true;
};
InspectReport inspect_checkpoint(const std::string& dir, const std::string& tag);

// `dir` itself when it holds metadata.json, else the checkpoint `tag` (or latest) inside it.
std::string resolve_checkpoint(const std::string& dir, const std::string& tag);

}  // namespace tessera::checkpoint
