#include "engine/checkpoint/export.h"

#include <ATen/ops/empty.h>
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "engine/checkpoint/metadata.h"
#include "engine/checkpoint/reshard.h"
#include "engine/checkpoint/safetensors.h"

namespace tessera::checkpoint {

namespace {

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

at::ScalarType export_dtype(const std::string& name) {
  if (name == "fp32") return at::kFloat;
  if (name == "bf16") return at::kBFloat16;
  if (name == "fp16") return at::kHalf;
  throw std::invalid_argument("tessera checkpoint export: --dtype " + name + ": expected fp32, bf16 or fp16");
}

std::string human(double bytes) {
  char buf[32];
  if (bytes >= 1e9) std::snprintf(buf, sizeof(buf), "%.2f GB", bytes / 1e9);
  else if (bytes >= 1e6) std::snprintf(buf, sizeof(buf), "%.2f MB", bytes / 1e6);
  else std::snprintf(buf, sizeof(buf), "%.0f B", bytes);
  return buf;
}

}  // namespace

int64_t parse_size(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  std::transform(unit.begin(), unit.end(), unit.begin(), ::toupper);
  const std::map<std::string, double> units = {{"", 1},      {"B", 1},       {"KB", 1e3},   {"MB", 1e6},
                                               {"GB", 1e9},  {"TB", 1e12},   {"KIB", 1024}, {"MIB", 1 << 20},
                                               {"GIB", 1 << 30}, {"TIB", 1099511627776.0}};
  auto u = units.find(unit);
  if (used == 0 || u == units.end() || !(value > 0))
    throw std::invalid_argument("tessera: size \"" + text + "\": expected a positive number with an optional unit (5GB, 500MB, 2GiB)");
  return static_cast<int64_t>(std::llround(value * u->second));
}

std::string resolve_checkpoint(const std::string& dir, const std::string& tag) {
  if (tag.empty() && is_file(dir + "/" + kMetadataFile)) return dir;
  return checkpoint_path(dir, tag);
}

ExportResult export_checkpoint(const ExportOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  ExportOptions o = options;
  const at::ScalarType dtype = export_dtype(o.dtype);
  const std::string suffix = ".safetensors";
  if (o.hf) o.output += "/model.safetensors";
  if (o.output.size() <= suffix.size() || o.output.compare(o.output.size() - suffix.size(), suffix.size(), suffix) != 0)
    throw std::invalid_argument("tessera checkpoint export: -o " + o.output + ": expected a path ending in .safetensors");
  ExportResult result;
  result.checkpoint = resolve_checkpoint(o.dir, o.tag);
  const Metadata m = Metadata::read(result.checkpoint);
  if (o.hf && !m.hf_config.is_object())
    throw std::invalid_argument("tessera checkpoint export --hf: " + result.checkpoint +
                                " records no Hugging Face config (it was saved from a model that is not a transformers "
                                "PreTrainedModel, or by the C++ engine): export the weights alone without --hf");
  if (o.hf && ::mkdir(options.output.c_str(), 0755) != 0 && errno != EEXIST)  // only once there is something to write
    throw std::runtime_error("tessera checkpoint export: cannot create the directory " + options.output + ": " +
                             std::strerror(errno));
  // One whole tensor per name: tensor-parallel slices put together, a weight tied across pipeline
  // stages (saved by each) taken once.
  const SavedParameters saved(m);
  std::map<std::string, const SavedParameter*> by_name;
  for (const ParameterRecord& p : m.parameters) by_name.emplace(p.name, saved.find(p.name));
  CheckpointFiles files(result.checkpoint, m);
  // Output files of at most max_shard_bytes each, in name order.
  std::vector<std::vector<const SavedParameter*>> shards(1);
  int64_t in_shard = 0;
  const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
  auto numel = [](const SavedParameter* p) {
    int64_t n = 1;
    for (int64_t d : p->whole_shape) n *= d;
    return n;
  };
  for (const auto& [name, p] : by_name) {
    const int64_t bytes = numel(p) * element;
    if (in_shard > 0 && in_shard + bytes > o.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(p);
    in_shard += bytes;
    result.parameters += 1;
    result.elements += numel(p);
    result.bytes += bytes;
  }
  const std::string stem = o.output.substr(0, o.output.size() - suffix.size());
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t k = 0; k < shards.size(); ++k) {
    char name[64];
    std::snprintf(name, sizeof(name), "-%05zu-of-%05zu", k + 1, shards.size());
    const std::string path = shards.size() == 1 ? o.output : stem + name + suffix;
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const SavedParameter* p : shards[k]) {
      const at::Tensor whole = read_elements(files, *p, "fp32", whole_indices(p->whole_shape, {}, 0, 1, 0, numel(p)));
      tensors.emplace_back(p->name, whole.to(dtype).view(p->whole_shape));
      const size_t slash = path.rfind('/');
      weight_map[p->name] = slash == std::string::npos ? path : path.substr(slash + 1);
    }
    write_safetensors_replacing(path, tensors, {{"format", "pt"}});
    result.files.push_back(path);
  }
  if (shards.size() > 1) {
    const std::string index = o.output + ".index.json";
    nlohmann::json j = {{"metadata", {{"total_size", result.bytes}}}, {"weight_map", weight_map}};
    write_file_durably(index, j.dump(2));
    result.files.push_back(index);
  }
  if (o.hf) {
    nlohmann::json config = m.hf_config;
    const char* dtype_name = dtype == at::kFloat ? "float32" : dtype == at::kBFloat16 ? "bfloat16" : "float16";
    for (const char* key : {"dtype", "torch_dtype"})  // transformers 5 names it dtype, 4 torch_dtype
      if (config.contains(key)) config[key] = dtype_name;
    const std::string path = options.output + "/config.json";
    write_file_durably(path, config.dump(2) + "\n");
    result.files.push_back(path);
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

InspectReport inspect_checkpoint(const std::string& dir, const std::string& tag) {
  std::ostringstream out;
  InspectReport report;
  // The tags in a save directory, and which one latest names.
  if (!is_file(dir + "/" + kMetadataFile)) {
    std::vector<std::string> tags;
    if (DIR* d = ::opendir(dir.c_str())) {
      while (dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name[0] != '.' && is_file(dir + "/" + name + "/" + kMetadataFile)) tags.push_back(name);
      }
      ::closedir(d);
    }
    std::sort(tags.begin(), tags.end());
    std::string latest;
    try {
      latest = read_latest(dir);
    } catch (const std::exception&) {
    }
    out << dir << ": " << tags.size() << " checkpoint(s)";
    for (const std::string& t : tags) out << (t == tags.front() ? ": " : ", ") << t << (t == latest ? " (latest)" : "");
    out << "\n";
  }
  const std::string path = resolve_checkpoint(dir, tag);
  const Metadata m = Metadata::read(path);
  const nlohmann::json& e = m.engine;
  out << "checkpoint " << path << " (tag " << m.tag << ")\n";
  out << "  layout      " << m.layout.str() << ", " << m.layout.world_size << " rank(s)\n";
  out << "  states      ";
  for (const std::string& s : m.layout.states) out << s << (s == m.layout.states.back() ? "\n" : ", ");
  out << "  step        " << e.value("global_step", 0) << " (skipped " << e.value("skipped_steps", 0) << ")";
  if (e.contains("loss_scaler")) out << ", loss scale " << e["loss_scaler"].value("scale", 1.0);
  if (e.contains("lr_scheduler")) out << ", schedule " << e["lr_scheduler"].get<std::string>();
  out << "\n";
  int64_t elements = 0;
  for (const ParameterRecord& p : m.parameters) elements += p.numel();
  out << "  parameters  " << m.parameters.size() << " tensors, " << elements << " elements\n";
  for (const ParameterRecord& p : m.parameters) {
    out << "    " << p.name << " [";
    for (size_t i = 0; i < p.shape.size(); ++i) out << (i ? ", " : "") << p.shape[i];
    out << "] " << p.dtype << ", " << p.shards.size() << " shard(s)";
    if (m.layout.pipeline_parallel > 1) out << ", stage " << p.pipeline_stage;
    if (p.tensor_rank >= 0) out << ", tensor rank " << p.tensor_rank;
    out << "\n";
  }
  if (!m.client_state.empty()) out << "  client_state " << m.client_state.dump() << "\n";
  // Every tensor of every file, read and checked.
  CheckpointFiles files(path, m);
  int64_t bytes = 0, tensors = 0, failed = 0;
  const auto start = std::chrono::steady_clock::now();
  for (const auto& [file, rec] : m.files) {
    std::string problem;
    for (const auto& [tensor, sum] : rec.xxh64) {
      try {
        files.read(file, tensor);
        ++tensors;
      } catch (const std::exception& error) {
        problem = error.what();
        ++failed;
        break;
      }
    }
    bytes += rec.bytes;
    out << "  file        " << file << "  " << human(double(rec.bytes)) << "  " << rec.xxh64.size() << " tensors  "
        << (problem.empty() ? "ok" : "FAILED: " + problem) << "\n";
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  char line[160];
  std::snprintf(line, sizeof(line), "  verified    %lld tensors in %zu file(s), %s in %.2f s (%.2f GB/s)%s\n",
                (long long)tensors, m.files.size(), human(double(bytes)).c_str(), seconds,
                seconds > 0 ? bytes / seconds / 1e9 : 0.0, failed ? "; some files FAILED" : "; all checksums match");
  out << line;
  report.ok = failed == 0;
  report.text = out.str();
  return report;
}

}  // namespace tessera::checkpoint
