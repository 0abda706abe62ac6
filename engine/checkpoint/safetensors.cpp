#include "engine/checkpoint/safetensors.h"

#include "engine/checkpoint/file_io.h"

#include <cstdio>

#include <ATen/ops/empty.h>
#include <c10/util/StringUtil.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

namespace tessera::checkpoint {

namespace {

using nlohmann::json;

const std::vector<std::pair<std::string, at::ScalarType>>& dtype_table() {
  static const std::vector<std::pair<std::string, at::ScalarType>> table = {
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16}, {"I64", at::kLong},
      {"I32", at::kInt},    {"I16", at::kShort}, {"I8", at::kChar},   {"U8", at::kByte},        {"BOOL", at::kBool}};
  return table;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

std::string safetensors_dtype(at::ScalarType type) {
  for (const auto& [name, t] : dtype_table())
    if (t == type) return name;
  throw SafetensorsError(std::string("tessera: safetensors has no dtype for ") + c10::toString(type));
}

at::ScalarType scalar_type_of(const std::string& dtype) {
  for (const auto& [name, t] : dtype_table())
    if (name == dtype) return t;
  throw SafetensorsError("tessera: unsupported safetensors dtype \"" + dtype + "\"");
}

std::string safetensors_prefix(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata, int64_t align, const std::string& path) {
  json header = json::object();
  std::set<std::string> names;
  int64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name == "__metadata__" || !names.insert(name).second)
      throw SafetensorsError("tessera: writing " + path + ": the tensor name \"" + name + "\" is " +
                             (name == "__metadata__" ? "reserved" : "used twice"));
    const int64_t bytes = static_cast<int64_t>(tensor.nbytes());
    header[name] = {{"dtype", safetensors_dtype(tensor.scalar_type())},
                    {"shape", tensor.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append(static_cast<size_t>((align - static_cast<int64_t>(8 + text.size()) % align) % align), ' ');
  const uint64_t size = text.size();
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>((size >> (8 * i)) & 0xff);
  return prefix + text;
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, at::Tensor>> host;
  for (const auto& [name, tensor] : tensors) host.emplace_back(name, tensor.detach().to(at::kCPU).contiguous());
  const std::string prefix = safetensors_prefix(host, metadata, 8, path);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw os_error("cannot create", path);
  try {
    write_all(fd, prefix.data(), static_cast<int64_t>(prefix.size()), path);
    for (const auto& [name, t] : host)
      write_all(fd, static_cast<const char*>(t.const_data_ptr()), t.numel() * static_cast<int64_t>(t.element_size()), path);
    if (::fsync(fd) != 0) throw os_error("fsync of", path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw os_error("closing", path);
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw os_error("cannot open", path);
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw os_error("cannot stat", path);
    const int64_t file_size = st.st_size;
    if (file_size < 8) throw SafetensorsError("tessera: " + path + " is " + std::to_string(file_size) +
                                              " bytes long: too short for a safetensors file");
    unsigned char prefix[8];
    read_all(fd_, reinterpret_cast<char*>(prefix), 8, 0, path);
    uint64_t size = 0;
    for (int i = 7; i >= 0; --i) size = (size << 8) | prefix[i];
    if (size > uint64_t(file_size - 8))
      throw SafetensorsError("tessera: " + path + ": its header claims " + std::to_string(size) + " bytes but the file has " +
                             std::to_string(file_size - 8) + " after the size (truncated, or not safetensors)");
    std::string text(size, '\0');
    read_all(fd_, text.data(), static_cast<int64_t>(size), 8, path);
    data_start_ = 8 + static_cast<int64_t>(size);
    json header;
    try {
      header = json::parse(text);
    } catch (const json::exception& e) {
      throw SafetensorsError("tessera: " + path + ": the header is not JSON (" + e.what() + ")");
    }
    if (!header.is_object()) throw SafetensorsError("tessera: " + path + ": the header is not a JSON object");
    const int64_t data_size = file_size - data_start_;
    std::vector<std::pair<int64_t, std::string>> spans;  // begin, name: checked for overlaps
    for (const auto& item : header.items()) {
      const std::string& name = item.key();
      if (name == "__metadata__") {
        if (!item.value().is_object()) throw SafetensorsError("tessera: " + path + ": __metadata__ is not an object");
        for (const auto& m : item.value().items()) {
          if (!m.value().is_string())
            throw SafetensorsError("tessera: " + path + ": __metadata__." + m.key() + " is not a string");
          metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      const json& entry = item.value();
      auto bad = [&](const std::string& why) {
        return SafetensorsError("tessera: " + path + ": tensor \"" + name + "\": " + why);
      };
      if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
        throw bad("expected an object with dtype, shape and data_offsets");
      TensorRecord r;
      try {
        r.dtype = entry.at("dtype").get<std::string>();
        r.shape = entry.at("shape").get<std::vector<int64_t>>();
        const auto offsets = entry.at("data_offsets").get<std::vector<int64_t>>();
        if (offsets.size() != 2) throw bad("data_offsets must hold 2 numbers");
        r.begin = offsets[0], r.end = offsets[1];
      } catch (const json::exception& e) {
        throw bad(std::string("malformed entry (") + e.what() + ")");
      }
      at::ScalarType type;
      try {
        type = scalar_type_of(r.dtype);
      } catch (const SafetensorsError& e) {
        throw bad(e.what());
      }
      for (int64_t d : r.shape)
        if (d < 0) throw bad("negative dimension");
      const int64_t expected = numel_of(r.shape) * static_cast<int64_t>(c10::elementSize(type));
      if (r.begin < 0 || r.end < r.begin || r.end > data_size)
        throw bad("data_offsets [" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ") outside the file's " +
                  std::to_string(data_size) + " data bytes (truncated?)");
      if (r.end - r.begin != expected)
        throw bad("data_offsets hold " + std::to_string(r.end - r.begin) + " bytes, its shape and dtype need " +
                  std::to_string(expected));
      spans.emplace_back(r.begin, name);
      tensors_.emplace(name, std::move(r));
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) {
      const TensorRecord& previous = tensors_.at(spans[i - 1].second);
      if (spans[i].first < previous.end)
        throw SafetensorsError("tessera: " + path + ": tensors \"" + spans[i - 1].second + "\" and \"" + spans[i].second +
                               "\" overlap");
    }
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

const TensorRecord& SafetensorsReader::record(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw SafetensorsError("tessera: " + path_ + " has no tensor \"" + name + "\"");
  return it->second;
}

at::Tensor SafetensorsReader::read(const std::string& name) const {
  const TensorRecord& r = record(name);
  at::Tensor out = at::empty(r.shape, at::TensorOptions().dtype(scalar_type_of(r.dtype)));
  read_all(fd_, static_cast<char*>(out.data_ptr()), r.end - r.begin, data_start_ + r.begin, path_);
  return out;
}

void SafetensorsReader::read_into(const std::string& name, at::Tensor& out) const {
  const TensorRecord& r = record(name);
  if (out.sizes().vec() != r.shape || out.scalar_type() != scalar_type_of(r.dtype))
    throw SafetensorsError("tessera: " + path_ + ": tensor \"" + name + "\" is " + r.dtype + " " +
                           c10::str(c10::IntArrayRef(r.shape)) + ", not " + safetensors_dtype(out.scalar_type()) + " " +
                           c10::str(out.sizes()));
  if (out.is_cpu() && out.is_contiguous()) {
    read_all(fd_, static_cast<char*>(out.data_ptr()), r.end - r.begin, data_start_ + r.begin, path_);
    return;
  }
  out.copy_(read(name));
}

void write_safetensors_replacing(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                 const std::map<std::string, std::string>& metadata) {
  write_safetensors(path + ".tmp", tensors, metadata);
  if (::rename((path + ".tmp").c_str(), path.c_str()) != 0) throw os_error("cannot rename " + path + ".tmp to", path);
}

}  // namespace tessera::checkpoint
