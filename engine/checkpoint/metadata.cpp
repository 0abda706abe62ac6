#include "engine/checkpoint/metadata.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace tessera::checkpoint {

using nlohmann::json;

std::string rank_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "rank%05d.safetensors", rank);
  return buf;
}

int64_t ParameterRecord::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool Layout::operator==(const Layout& o) const {
  return world_size == o.world_size && data_parallel == o.data_parallel && tensor_parallel == o.tensor_parallel &&
         pipeline_parallel == o.pipeline_parallel && zero_stage == o.zero_stage && optimizer == o.optimizer &&
         compute_dtype == o.compute_dtype && states == o.states;
}

std::string Layout::str() const {
  return "data " + std::to_string(data_parallel) + " x tensor " + std::to_string(tensor_parallel) + " x pipe " +
         std::to_string(pipeline_parallel) + ", ZeRO " + std::to_string(zero_stage) + ", " + optimizer + ", " +
         compute_dtype;
}

const ParameterRecord* Metadata::find(const std::string& name, int pipeline_stage, int tensor_rank) const {
  auto it = index_.find(std::make_tuple(name, pipeline_stage, tensor_rank));
  return it == index_.end() ? nullptr : &parameters[it->second];
}

ParameterRecord& Metadata::add(const std::string& name, int pipeline_stage, int tensor_rank) {
  auto [it, fresh] = index_.emplace(std::make_tuple(name, pipeline_stage, tensor_rank), parameters.size());
  if (fresh) {
    parameters.emplace_back();
    parameters.back().name = name;
    parameters.back().pipeline_stage = pipeline_stage;
    parameters.back().tensor_rank = tensor_rank;
  }
  return parameters[it->second];
}

json Metadata::to_json() const {
  json j;
  j["format"] = "tessera-checkpoint";
  j["version"] = kFormatVersion;
  j["tag"] = tag;
  j["layout"] = {{"world_size", layout.world_size},         {"data_parallel", layout.data_parallel},
                 {"tensor_parallel", layout.tensor_parallel}, {"pipeline_parallel", layout.pipeline_parallel},
                 {"zero_stage", layout.zero_stage},           {"optimizer", layout.optimizer},
                 {"compute_dtype", layout.compute_dtype},     {"states", layout.states}};
  j["engine"] = engine;
  j["client_state"] = client_state;
  if (!hf_config.is_null()) j["hf_config"] = hf_config;
  json params = json::array();
  for (const ParameterRecord& p : parameters) {
    json shards = json::array();
    for (const ShardRecord& s : p.shards) shards.push_back({{"file", s.file}, {"begin", s.begin}, {"end", s.end}});
    params.push_back({{"name", p.name}, {"shape", p.shape}, {"dtype", p.dtype}, {"pipeline_stage", p.pipeline_stage},
                      {"tensor_rank", p.tensor_rank}, {"shards", shards}});
    if (p.split.sharded()) params.back()["split"] = {p.split.dim, p.split.fused};
  }
  j["parameters"] = params;
  json groups = json::array();
  for (const GroupRecord& g : this->groups)
    groups.push_back({{"first_parameter", g.first_parameter}, {"pipeline_stage", g.pipeline_stage},
                      {"tensor_rank", g.tensor_rank}, {"file", g.file}, {"states", g.states}});
  j["groups"] = groups;
  json files_json = json::object();
  for (const auto& [name, f] : files) files_json[name] = {{"rank", f.rank}, {"bytes", f.bytes}, {"xxh64", f.xxh64}};
  j["files"] = files_json;
  return j;
}

namespace {

// A field of `j` of the expected JSON type, or an error naming the file and the field's path.
struct Reader {
  const std::string& path;
  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw std::runtime_error("tessera: checkpoint metadata " + path + ": " + where + ": " + what);
  }
  const json& get(const json& j, const std::string& key, const std::string& where, json::value_t type) const {
    if (!j.is_object() || !j.contains(key)) fail(where + "." + key, "missing");
    const json& v = j.at(key);
    const bool ok = v.type() == type || (type == json::value_t::number_integer && v.is_number_unsigned());
    if (!ok) fail(where + "." + key, std::string("expected a ") + json(type).type_name() + ", found " + v.type_name());
    return v;
  }
  int64_t integer(const json& j, const std::string& key, const std::string& where) const {
    return get(j, key, where, json::value_t::number_integer).get<int64_t>();
  }
  std::string string(const json& j, const std::string& key, const std::string& where) const {
    return get(j, key, where, json::value_t::string).get<std::string>();
  }
  std::vector<std::string> strings(const json& j, const std::string& key, const std::string& where) const {
    std::vector<std::string> out;
    for (const json& s : get(j, key, where, json::value_t::array)) {
      if (!s.is_string()) fail(where + "." + key, "expected strings");
      out.push_back(s.get<std::string>());
    }
    return out;
  }
};

}  // namespace

Metadata Metadata::parse(const std::string& text, const std::string& path) {
  const Reader r{path};
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) r.fail("(file)", "not valid JSON");
  if (r.string(j, "format", "") != "tessera-checkpoint") r.fail(".format", "expected \"tessera-checkpoint\"");
  const int64_t version = r.integer(j, "version", "");
  if (version != kFormatVersion)
    r.fail(".version", "this tessera reads version " + std::to_string(kFormatVersion) + ", found " + std::to_string(version));
  Metadata m;
  m.tag = r.string(j, "tag", "");
  const json& l = r.get(j, "layout", "", json::value_t::object);
  m.layout.world_size = static_cast<int>(r.integer(l, "world_size", ".layout"));
  m.layout.data_parallel = static_cast<int>(r.integer(l, "data_parallel", ".layout"));
  m.layout.tensor_parallel = static_cast<int>(r.integer(l, "tensor_parallel", ".layout"));
  m.layout.pipeline_parallel = static_cast<int>(r.integer(l, "pipeline_parallel", ".layout"));
  m.layout.zero_stage = static_cast<int>(r.integer(l, "zero_stage", ".layout"));
  m.layout.optimizer = r.string(l, "optimizer", ".layout");
  m.layout.compute_dtype = r.string(l, "compute_dtype", ".layout");
  m.layout.states = r.strings(l, "states", ".layout");
  m.engine = r.get(j, "engine", "", json::value_t::object);
  for (const char* counter : {"global_step", "skipped_steps", "optimizer_step_base", "schedule_step_base"})
    if (r.integer(m.engine, counter, ".engine") < 0) r.fail(std::string(".engine.") + counter, "negative");
  r.string(r.get(m.engine, "loss_scaler", ".engine", json::value_t::object), "type", ".engine.loss_scaler");
  m.client_state = j.contains("client_state") ? j.at("client_state") : json::object();
  if (j.contains("hf_config")) m.hf_config = r.get(j, "hf_config", "", json::value_t::object);
  for (const auto& [name, f] : r.get(j, "files", "", json::value_t::object).items()) {
    const std::string where = ".files[\"" + name + "\"]";
    if (name.empty() || name.find('/') != std::string::npos || name[0] == '.') r.fail(where, "not a file name");
    FileRecord rec;
    rec.rank = static_cast<int>(r.integer(f, "rank", where));
    rec.bytes = r.integer(f, "bytes", where);
    for (const auto& [tensor, sum] : r.get(f, "xxh64", where, json::value_t::object).items()) {
      if (!sum.is_string()) r.fail(where + ".xxh64", "expected strings");
      rec.xxh64[tensor] = sum.get<std::string>();
    }
    m.files[name] = std::move(rec);
  }
  const json& params = r.get(j, "parameters", "", json::value_t::array);
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string where = ".parameters[" + std::to_string(i) + "]";
    const json& p = params[i];
    ParameterRecord& rec = m.add(r.string(p, "name", where), static_cast<int>(r.integer(p, "pipeline_stage", where)),
                                 static_cast<int>(r.integer(p, "tensor_rank", where)));
    if (!rec.dtype.empty()) r.fail(where, rec.name + " is listed twice at the same pipeline stage and tensor rank");
    for (const json& d : r.get(p, "shape", where, json::value_t::array)) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) r.fail(where + ".shape", "expected sizes");
      rec.shape.push_back(d.get<int64_t>());
    }
    rec.dtype = r.string(p, "dtype", where);
    if (p.contains("split")) {
      const json& split = r.get(p, "split", where, json::value_t::array);
      if (rec.tensor_rank < 0 || split.size() != 2 || !split[0].is_number_integer() || !split[1].is_number_integer() ||
          split[0].get<int64_t>() < 0 || split[0].get<int64_t>() >= static_cast<int64_t>(rec.shape.size()) ||
          split[1].get<int64_t>() < 1)
        r.fail(where + ".split", "expected [dim, fused] of a tensor-parallel slice (dim < its rank, fused >= 1)");
      rec.split = TensorSplit{split[0].get<int64_t>(), split[1].get<int64_t>()};
    }
    const json& shards = r.get(p, "shards", where, json::value_t::array);
    for (size_t k = 0; k < shards.size(); ++k) {
      const std::string at = where + ".shards[" + std::to_string(k) + "]";
      ShardRecord s{r.string(shards[k], "file", at), r.integer(shards[k], "begin", at), r.integer(shards[k], "end", at)};
      if (!m.files.count(s.file)) r.fail(at + ".file", "\"" + s.file + "\" is not in .files");
      rec.shards.push_back(std::move(s));
    }
    // The shards must cover [0, numel) exactly, once.
    std::sort(rec.shards.begin(), rec.shards.end(), [](const ShardRecord& a, const ShardRecord& b) { return a.begin < b.begin; });
    int64_t next = 0;
    for (const ShardRecord& s : rec.shards) {
      if (s.begin != next || s.end <= s.begin)
        r.fail(where, "the shards of " + rec.name + " do not cover its " + std::to_string(rec.numel()) +
                          " elements exactly (a range starts at " + std::to_string(s.begin) + ", expected " +
                          std::to_string(next) + ")");
      next = s.end;
    }
    if (next != rec.numel() && rec.numel() > 0)
      r.fail(where, "the shards of " + rec.name + " end at element " + std::to_string(next) + " of " +
                        std::to_string(rec.numel()));
  }
  const json& groups = r.get(j, "groups", "", json::value_t::array);
  for (size_t i = 0; i < groups.size(); ++i) {
    const std::string where = ".groups[" + std::to_string(i) + "]";
    GroupRecord g;
    g.first_parameter = r.string(groups[i], "first_parameter", where);
    g.pipeline_stage = static_cast<int>(r.integer(groups[i], "pipeline_stage", where));
    g.tensor_rank = static_cast<int>(r.integer(groups[i], "tensor_rank", where));
    g.file = r.string(groups[i], "file", where);
    g.states = r.strings(groups[i], "states", where);
    if (!m.files.count(g.file)) r.fail(where + ".file", "\"" + g.file + "\" is not in .files");
    m.groups.push_back(std::move(g));
  }
  return m;
}

namespace {

bool written_by_deepspeed(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const std::string suffix = "_model_states.pt";
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) return true;
  }
  return false;
}

}  // namespace

Metadata Metadata::read(const std::string& checkpoint_dir) {
  const std::string path = checkpoint_dir + "/" + kMetadataFile;
  std::ifstream in(path, std::ios::binary);
  if (!in && written_by_deepspeed(checkpoint_dir))
    throw std::runtime_error("tessera: " + checkpoint_dir + " was written by DeepSpeed (*_model_states.pt, no " +
                             kMetadataFile + "): convert it once with `tessera checkpoint import-deepspeed " +
                             checkpoint_dir + " OUT` and load OUT (docs/checkpoints.md, \"From DeepSpeed\")");
  if (!in)
    throw std::runtime_error("tessera: " + path + " cannot be read: " + checkpoint_dir +
                             " is not a complete tessera checkpoint (metadata.json is written last)");
  std::stringstream text;
  text << in.rdbuf();
  return parse(text.str(), path);
}

}  // namespace tessera::checkpoint
