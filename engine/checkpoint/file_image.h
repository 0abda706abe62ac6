// An asynchronous save's snapshot of this rank's checkpoint file, laid out in host memory as the
// file itself: the safetensors prefix with its header padded by spaces to a 4 KiB boundary, then
// every tensor's bytes back to back. The save call fills it (training changes the engine's buffers
// right after); the writer thread hashes each tensor's range and hands the whole image to the disk
// with O_DIRECT (file_io.h). The bytes are copied once (the engine's buffers into the image), not
// twice (into a snapshot, then into the page cache), and a checkpoint of gigabytes does not push
// training's own pages out of the cache.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/checkpoint/rank_state.h"

namespace tessera::checkpoint {

struct FileImage {
  struct Range {
    std::string name;
    int64_t begin = 0, bytes = 0;  // where the tensor's bytes are in the image (and the file)
  };
  // uint8, aligned to kAioAlignment and aio_aligned(size) long (the tail zeros); its own
  // mapping, given back to the system when the last view of it goes (pinned host memory when a
  // tensor is on a device).
  at::Tensor buffer;
  int64_t size = 0;  // the file's length
  std::vector<Range> tensors;
  const char* data() const { return static_cast<const char*>(buffer.const_data_ptr()); }
};

// Copies `tensors` (any device, contiguous or not) into a new image of the file that
// write_safetensors would write with `metadata`, its data starting at 4096 bytes (or a multiple).
FileImage make_file_image(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata,
                          const std::string& path);

// Writes the image to `path` (write_file_direct) and fsyncs it; returns whether with O_DIRECT.
bool write_file_image(const FileImage& image, const std::string& path);

}  // namespace tessera::checkpoint
