// The safetensors file format (Hugging Face's), the container of tessera's checkpoints (issue 18):
//
//   [8 bytes: N, little-endian]  [N bytes: a JSON header]  [the tensors' bytes]
//
// The header maps each tensor's name to {"dtype", "shape", "data_offsets": [begin, end)} (offsets
// into the bytes after the header), plus an optional "__metadata__" object of strings. Nothing in a
// file is executed when it is read (no pickle). The reader checks the whole header before it reads
// a tensor: the JSON, every dtype, offsets inside the file that match the shape's size and do not
// overlap, and says which file and which tensor when something is wrong.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace tessera::checkpoint {

class SafetensorsError : public std::runtime_error {
 public:
  explicit SafetensorsError(const std::string& what) : std::runtime_error(what) {}
};

// One tensor's entry in the header.
struct TensorRecord {
  std::string dtype;           // "F32", "BF16", "I64", ... (the format's names)
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  // byte offsets into the data
};

// Writes `tensors` (unique names, any device, contiguous or not) and `metadata` to `path` and
// fsyncs it. The header is padded with spaces to a multiple of 8 bytes, so every tensor starts
// aligned. A failed write throws std::runtime_error naming the path (the caller writes into a
// temporary name and renames: engine/checkpoint/ never leaves a half-written file under its name).
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// The file's first bytes for `tensors` (names, dtypes and shapes; their values are not read, so
// they may be anywhere) laid out back to back in order: the 8-byte size, then the JSON header
// padded with spaces (which the format allows) so that the data starts at a multiple of `align`
// bytes: 8 for write_safetensors, 4096 for a file image written with O_DIRECT (file_image.h).
std::string safetensors_prefix(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata, int64_t align, const std::string& path);

// write_safetensors into `path`.tmp, renamed to `path`: a file that is never half-written under its
// own name (exported models, save_16bit_model).
void write_safetensors_replacing(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                 const std::map<std::string, std::string>& metadata = {});

// An opened file whose header has been checked; tensors are read on request.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorRecord>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // A new CPU tensor with the file's values.
  at::Tensor read(const std::string& name) const;
  // Into `out` (any device), which must have the record's shape and dtype.
  void read_into(const std::string& name, at::Tensor& out) const;

 private:
  const TensorRecord& record(const std::string& name) const;

  std::string path_;
  int fd_ = -1;
  int64_t data_start_ = 0;
  std::map<std::string, TensorRecord> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The format's dtype name for a tensor dtype, and back (SafetensorsError for one it lacks).
std::string safetensors_dtype(at::ScalarType type);
at::ScalarType scalar_type_of(const std::string& dtype);

}  // namespace tessera::checkpoint
