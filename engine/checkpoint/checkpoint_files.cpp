#include "engine/checkpoint/checkpoint_files.h"

#include <ATen/ops/empty.h>
#include <sys/stat.h>

#include <algorithm>
#include <stdexcept>

#include "engine/checkpoint/checksum.h"

namespace tessera::checkpoint {

at::Tensor CheckpointFiles::read(const std::string& file, const std::string& tensor) {
  const std::string path = dir_ + "/" + file;
  auto rec = m_.files.find(file);
  if (rec == m_.files.end()) throw std::runtime_error("tessera: " + path + " is not listed in the checkpoint's metadata");
  auto sum = rec->second.xxh64.find(tensor);
  if (sum == rec->second.xxh64.end())
    throw std::runtime_error("tessera: " + path + ": the metadata lists no tensor \"" + tensor + "\" in this file");
  SafetensorsReader& reader = open(path, rec->second);
  if (!reader.contains(tensor))
    throw std::runtime_error("tessera: " + path + " has no tensor \"" + tensor + "\", which the metadata lists");
  at::Tensor t = reader.read(tensor);
  const std::string actual = xxh64_hex(t.data_ptr(), t.nbytes());
  if (actual != sum->second)
    throw std::runtime_error("tessera: " + path + ": tensor \"" + tensor + "\" fails its checksum (xxh64 " + actual +
                             ", the metadata records " + sum->second + "): the file is damaged");
  return t;
}

bool CheckpointFiles::lists(const std::string& file, const std::string& tensor) const {
  auto f = m_.files.find(file);
  return f != m_.files.end() && f->second.xxh64.count(tensor);
}

SafetensorsReader& CheckpointFiles::open(const std::string& path, const FileRecord& rec) {
  auto it = readers_.find(path);
  if (it != readers_.end()) return *it->second;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw std::runtime_error("tessera: " + path + " is missing from the checkpoint");
  if (static_cast<int64_t>(st.st_size) != rec.bytes)
    throw std::runtime_error("tessera: " + path + " is " + std::to_string(st.st_size) + " bytes, the metadata records " +
                             std::to_string(rec.bytes) + " (truncated or replaced)");
  return *readers_.emplace(path, std::make_unique<SafetensorsReader>(path)).first->second;
}

// Elements [begin, begin + numel) of parameter `p`'s state `state`, from the shards that hold them.
at::Tensor read_range(CheckpointFiles& files, const ParameterRecord& p, const std::string& state, int64_t begin,
                      int64_t numel) {
  at::Tensor out;
  for (const ShardRecord& s : p.shards) {
    const int64_t lo = std::max(begin, s.begin), hi = std::min(begin + numel, s.end);
    if (lo >= hi) continue;
    const std::string name = state + "/" + p.name;
    at::Tensor t = files.read(s.file, name);
    if (t.dim() != 1 || t.numel() != s.end - s.begin)
      throw std::runtime_error("tessera: " + s.file + ": tensor \"" + name + "\" holds " + std::to_string(t.numel()) +
                               " elements; its shard [" + std::to_string(s.begin) + ", " + std::to_string(s.end) +
                               ") of " + p.name + " needs " + std::to_string(s.end - s.begin));
    if (s.begin == begin && s.end == begin + numel) return t;  // the same range as saved: no copy
    if (!out.defined()) out = at::empty({numel}, t.options());
    out.narrow(0, lo - begin, hi - lo).copy_(t.narrow(0, lo - s.begin, hi - lo));
  }
  return out;
}

}  // namespace tessera::checkpoint
