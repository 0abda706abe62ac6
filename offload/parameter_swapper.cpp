#include "offload/parameter_swapper.h"

#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "offload/swap_directory.h"

namespace tessera {

ParameterSwapper::ParameterSwapper(ParameterSwapOptions options) : options_(std::move(options)) {
  options_.buffer_count = std::max(options_.buffer_count, 1);
}

ParameterSwapper::~ParameterSwapper() {
  // The I/O thread drains before the buffers and files it uses go (io_ is declared last).
  if (io_) {
    try {
      io_->wait_all();
    } catch (const std::exception&) {
    }
  }
}

const ParameterSwapper::Group& ParameterSwapper::group(int index) const {
  if (index < 0 || index >= static_cast<int>(groups_.size()) || !groups_[index])
    throw std::logic_error("tessera: parameter swapper: group " + std::to_string(index) + " is not registered");
  return *groups_[index];
}

int64_t ParameterSwapper::chunk_bytes(const Group& g, int bucket) const {
  return g.chunks.at(bucket).numel * static_cast<int64_t>(c10::elementSize(g.dtype));
}

void ParameterSwapper::add_group(int index, const std::vector<int64_t>& chunk_numel, at::ScalarType dtype) {
  if (io_) throw std::logic_error("tessera: parameter swapper: add_group after create_files");
  if (index >= static_cast<int>(groups_.size())) groups_.resize(index + 1);
  auto g = std::make_unique<Group>();
  g->dtype = dtype;
  g->path = options_.path + "/tessera-param-rank" + std::to_string(options_.rank) + "-group" + std::to_string(index) +
            ".swp";
  for (int64_t numel : chunk_numel) {
    Chunk c;
    c.numel = numel;
    c.file_offset = g->file_bytes;
    g->chunks.push_back(c);
    const int64_t bytes = aio_aligned(numel * static_cast<int64_t>(c10::elementSize(dtype)));
    g->file_bytes += bytes;
    largest_chunk_bytes_ = std::max(largest_chunk_bytes_, bytes);
    largest_chunk_numel_ = std::max(largest_chunk_numel_, numel);
  }
  groups_[index] = std::move(g);
}

void ParameterSwapper::create_files() {
  if (io_) throw std::logic_error("tessera: parameter swapper: create_files called twice");
  if (largest_chunk_numel_ > options_.buffer_numel)
    throw std::invalid_argument("tessera: zero_optimization.offload_param.buffer_size is " +
                                std::to_string(options_.buffer_numel) + " elements; the largest bucket's chunk on this "
                                "rank is " + std::to_string(largest_chunk_numel_) + ": raise buffer_size to at least that, "
                                "or lower reduce_bucket_size (a bucket holds one unit's parameters)");
  check_swap_directory("zero_optimization.offload_param.nvme_path", options_.path, file_bytes(),
                       "this rank's parameter swap files");
  // Only as large as the largest chunk needs (DeepSpeed allocates buffer_size each).
  buffers_.resize(options_.buffer_count);
  for (Buffer& b : buffers_) b.memory = AlignedBuffer(largest_chunk_bytes_);
  io_ = AsyncIo::create(options_.aio);
  for (auto& gp : groups_) {
    if (!gp) continue;
    gp->file = std::make_unique<AioFile>(AioFile::create(gp->path));
    if (gp->file->replaced_stale())
      std::fprintf(stderr, "[tessera] rank %d: replacing the stale parameter swap file %s (from a run that did not "
                   "exit normally; its contents are not read)\n", options_.rank, gp->path.c_str());
  }
}

at::Tensor ParameterSwapper::view(int b, const Group& g, int bucket) const {
  return at::from_blob(buffers_[b].memory.data(), {g.chunks[bucket].numel}, at::TensorOptions().dtype(g.dtype));
}

int ParameterSwapper::take_buffer() {
  if (!io_) throw std::logic_error("tessera: parameter swapper: used before create_files");
  const int n = static_cast<int>(buffers_.size());
  for (int i = 0; i < n; ++i) {
    const int b = (next_buffer_ + i) % n;
    Buffer& buffer = buffers_[b];
    if (buffer.group >= 0) continue;
    if (buffer.writing) io_->wait(std::exchange(buffer.writing, 0));
    buffer.writing_group = buffer.writing_bucket = -1;
    next_buffer_ = (b + 1) % n;
    return b;
  }
  throw std::logic_error("tessera: parameter swapper: all " + std::to_string(n) + " buffers are held (offload_param."
                         "buffer_count)");
}

void ParameterSwapper::wait_for_write_of(int group, int bucket) {
  for (Buffer& b : buffers_)
    if (b.writing && b.writing_group == group && b.writing_bucket == bucket) {
      io_->wait(std::exchange(b.writing, 0));
      b.writing_group = b.writing_bucket = -1;
    }
}

void ParameterSwapper::read(int index, int bucket, const at::Tensor& out) {
  out.copy_(swap_in(index, bucket));
  for (Buffer& b : buffers_)
    if (b.group == index && b.bucket == bucket) b.group = b.bucket = -1;  // nothing to write back
}

void ParameterSwapper::write(int index, int bucket, const at::Tensor& values) {
  swap_in(index, bucket, /*fill=*/false).copy_(values);
  swap_out(index, bucket);
}

at::Tensor ParameterSwapper::swap_in(int index, int bucket, bool fill) {
  const Group& g = group(index);
  wait_for_write_of(index, bucket);
  const int b = take_buffer();
  Buffer& buffer = buffers_[b];
  if (fill && g.chunks[bucket].numel > 0)
    io_->wait(io_->read(*g.file, buffer.memory.data(), chunk_bytes(g, bucket), g.chunks[bucket].file_offset));
  buffer.group = index;
  buffer.bucket = bucket;
  return view(b, g, bucket);
}

void ParameterSwapper::swap_out(int index, int bucket) {
  const Group& g = group(index);
  for (Buffer& b : buffers_) {
    if (b.group != index || b.bucket != bucket) continue;
    b.group = b.bucket = -1;
    if (g.chunks[bucket].numel == 0) return;
    b.writing = io_->write(*g.file, b.memory.data(), chunk_bytes(g, bucket), g.chunks[bucket].file_offset);
    b.writing_group = index;
    b.writing_bucket = bucket;
    return;
  }
  throw std::logic_error("tessera: parameter swapper: swap_out of a chunk not swapped in");
}

void ParameterSwapper::wait_all() {
  if (!io_) return;
  for (Buffer& b : buffers_) {
    b.writing = 0;
    b.writing_group = b.writing_bucket = -1;
  }
  io_->wait_all();
}

void ParameterSwapper::release_all() {
  for (Buffer& b : buffers_) b.group = b.bucket = -1;
}

int64_t ParameterSwapper::resident_bytes() const {
  int64_t total = 0;
  for (const Buffer& b : buffers_) total += b.memory.capacity();
  return total;
}

int64_t ParameterSwapper::file_bytes() const {
  int64_t total = 0;
  for (const auto& g : groups_)
    if (g) total += g->file_bytes;
  return total;
}

int64_t ParameterSwapper::bytes_read() const { return io_ ? io_->bytes_read() : 0; }
int64_t ParameterSwapper::bytes_written() const { return io_ ? io_->bytes_written() : 0; }
const std::string& ParameterSwapper::file_of(int index) const { return group(index).path; }

}  // namespace tessera
