#include "engine/checkpoint/rank_file.h"

#include <sys/stat.h>

#include <algorithm>
#include <stdexcept>

#include "engine/checkpoint/checksum.h"
#include "engine/checkpoint/safetensors.h"

namespace tessera::checkpoint {

using nlohmann::json;

int64_t RankFile::bytes() const {
  if (image) return static_cast<int64_t>(image->buffer.nbytes());
  int64_t n = 0;
  for (const auto& [name, t] : tensors) n += static_cast<int64_t>(t.nbytes());
  return n;
}

void RankFile::add_piece(const std::string& name, const std::vector<int64_t>& shape, const std::string& dtype,
                         int pipeline_stage, int tensor_rank, const TensorSplit& split, int64_t begin, int64_t numel) {
  params.push_back({{"name", name}, {"shape", shape}, {"dtype", dtype}, {"pipeline_stage", pipeline_stage},
                    {"tensor_rank", tensor_rank}, {"begin", begin}, {"end", begin + numel}});
  if (split.sharded()) params.back()["split"] = {split.dim, split.fused};
}

std::map<std::string, std::string> rank_file_metadata(int rank) {
  return {{"format", "tessera-checkpoint"}, {"rank", std::to_string(rank)}};
}

void RankFile::snapshot(int rank, const std::string& path) {
  image = make_file_image(tensors, rank_file_metadata(rank), path);
  tensors.clear();
}

json write_rank_file(const RankFile& f, const std::string& path, const std::string& file, int rank) {
  json sums = json::object();
  if (f.image) {
    for (const FileImage::Range& r : f.image->tensors) sums[r.name] = xxh64_hex(f.image->data() + r.begin, r.bytes);
    write_file_image(*f.image, path);
  } else {
    for (const auto& [name, t] : f.tensors) sums[name] = xxh64_hex(t.data_ptr(), t.nbytes());
    write_safetensors(path, f.tensors, rank_file_metadata(rank));
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw std::runtime_error("tessera: " + path + " vanished after it was written");
  return {{"file", file}, {"rank", rank}, {"bytes", static_cast<int64_t>(st.st_size)}, {"xxh64", sums},
          {"parameters", f.params}, {"groups", f.groups}};
}

Metadata merge(const std::vector<std::string>& entries, Metadata m) {
  for (const std::string& text : entries) {
    const json e = json::parse(text);
    const std::string file = e.at("file");
    m.files[file] = FileRecord{e.at("rank").get<int>(), e.at("bytes").get<int64_t>(),
                               e.at("xxh64").get<std::map<std::string, std::string>>()};
    for (const json& p : e.at("parameters")) {
      ParameterRecord& rec = m.add(p.at("name"), p.at("pipeline_stage"), p.at("tensor_rank"));
      if (rec.shards.empty()) {
        rec.shape = p.at("shape").get<std::vector<int64_t>>();
        rec.dtype = p.at("dtype");
        if (p.contains("split")) rec.split = TensorSplit{p.at("split")[0].get<int64_t>(), p.at("split")[1].get<int64_t>()};
      }
      rec.shards.push_back({file, p.at("begin").get<int64_t>(), p.at("end").get<int64_t>()});
    }
    for (const json& g : e.at("groups"))
      m.groups.push_back({g.at("first_parameter"), g.at("pipeline_stage").get<int>(), g.at("tensor_rank").get<int>(), file,
                          g.at("states").get<std::vector<std::string>>()});
  }
  for (ParameterRecord& p : m.parameters)
    std::sort(p.shards.begin(), p.shards.end(), [](const ShardRecord& a, const ShardRecord& b) { return a.begin < b.begin; });
  return m;
}

}  // namespace tessera::checkpoint
