// metadata.json: the one file that says what a checkpoint holds and where, written by global rank
// 0 after every rank has written its own file (rank00000.safetensors, ...):
//
//   {"format": "tessera-checkpoint", "version": 1, "tag": "global_step40",
//    "layout":  {"world_size", "data_parallel", "tensor_parallel", "pipeline_parallel",
//                "zero_stage", "optimizer", "compute_dtype", "states": ["fp32", "exp_avg", ...]},
//    "engine":  {"global_step", "micro_step", "skipped_steps", "optimizer_step_base",
//                "schedule_step_base", "loss_scaler": {...}, "lr_scheduler": "WarmupLR"},
//    "client_state": {...}, ["hf_config": {...}: a transformers model's config],
//    "parameters": [{"name", "shape", "dtype", "pipeline_stage", "tensor_rank", ["split": [dim, fused]],
//                    "shards": [{"file", "begin", "end"}, ...]}, ...],
//    "groups": [{"first_parameter", "pipeline_stage", "tensor_rank", "file", "states": [...]}],
//    "files": {"rank00000.safetensors": {"rank", "bytes", "xxh64": {"fp32/wte.weight": "…", ...}}}}
//
// A parameter is one tensor of the model, by its name and place (pipeline stage; tensor rank for a
// tensor-parallel slice, -1 for one every tensor rank holds whole; a slice's "split" says how it is
// cut from the whole parameter, tensor_parallel_slice's dim and fused over layout.tensor_parallel
// ranks, so that its elements are elements of the whole: engine/checkpoint/reshard.h); its shards are element ranges
// [begin, end) of the flattened tensor, disjoint and covering it, each held by one file. For each
// shard the file holds "<state>/<name>" for every state in layout.states ("fp32": the master
// weights; "compute": the model's own dtype under mixed precision; the optimizer's moments), 1-D,
// end − begin elements. That is all a loader needs to reshard: any rank of any data-parallel
// size or ZeRO stage finds the ranges it owns now by name. Optimizer state that is not laid out
// by element (optim/flat_optimizer.h's StateLayout) is stored per parameter ("<state>/<name>", one
// element, in the file of the shard that begins at 0), per group ("group/<first parameter>/<state>")
// or per rank ("local/<first parameter>/<state>", restored into the same layout only).
// Every tensor's XXH64 is recorded under its file.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "parallel/tensor_parallel/tensor_split.h"

namespace tessera::checkpoint {

constexpr int kFormatVersion = 1;
constexpr const char* kMetadataFile = "metadata.json";

std::string rank_file_name(int rank);  // "rank00003.safetensors"

struct ShardRecord {
  std::string file;
  int64_t begin = 0, end = 0;  // elements of the flattened parameter
};

struct ParameterRecord {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;  // the model's dtype, as safetensors names it ("F32", "BF16")
  int pipeline_stage = 0;
  int tensor_rank = -1;  // -1: whole on every tensor rank; else this tensor rank's slice
  TensorSplit split;     // a slice's cut from the whole (dim -1: unknown, written before splits were recorded)
  std::vector<ShardRecord> shards;
  int64_t numel() const;
};

struct GroupRecord {  // a parameter group's Group-layout state
  std::string first_parameter;
  int pipeline_stage = 0, tensor_rank = -1;
  std::string file;
  std::vector<std::string> states;
};

struct FileRecord {
  int rank = 0;
  int64_t bytes = 0;
  std::map<std::string, std::string> xxh64;  // tensor name -> checksum
};

struct Layout {
  int world_size = 1, data_parallel = 1, tensor_parallel = 1, pipeline_parallel = 1, zero_stage = 0;
  std::string optimizer, compute_dtype;
  std::vector<std::string> states;  // the Shard-layout states every shard holds
  bool operator==(const Layout& o) const;
  std::string str() const;  // "data 2 × tensor 1 × pipe 1, ZeRO 2, AdamW"
};

struct Metadata {
  std::string tag;
  Layout layout;
  nlohmann::json engine = nlohmann::json::object();
  nlohmann::json client_state = nlohmann::json::object();
  // The model's Hugging Face config (transformers' PretrainedConfig as JSON) when the engine trained
  // a transformers model; null otherwise. `tessera checkpoint export --hf` writes it as config.json.
  nlohmann::json hf_config;
  std::vector<ParameterRecord> parameters;
  std::vector<GroupRecord> groups;
  std::map<std::string, FileRecord> files;

  // The parameter by name and place, or null.
  const ParameterRecord* find(const std::string& name, int pipeline_stage, int tensor_rank) const;
  // The parameter by name and place, appended (no shards yet) when it is not there.
  ParameterRecord& add(const std::string& name, int pipeline_stage, int tensor_rank);
  nlohmann::json to_json() const;
  // Parses and checks `text` (the file at `path`, for messages): the format and version, every
  // field's type, shards that cover each parameter exactly and name a listed file. Throws
  // std::runtime_error naming the path and the field.
  static Metadata parse(const std::string& text, const std::string& path);
  static Metadata read(const std::string& checkpoint_dir);

 private:
  std::map<std::tuple<std::string, int, int>, size_t> index_;  // (name, stage, tensor rank) -> parameters[i]
};

}  // namespace tessera::checkpoint
