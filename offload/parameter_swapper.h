// NVMe parameter offload (ZeRO-Infinity's parameter half, Rajbhandari et al. 2021): at ZeRO stage 3
// a rank's shard of each partitioned parameter group, in the compute dtype, lives in a file under
// offload_param.nvme_path instead of memory. The shard is cut like the group's buckets (a bucket
// holds one unit's parameters, zero/flat_layout.h); each bucket's chunk has its own place in the
// file, aligned for O_DIRECT:
//
//     file:  chunk of bucket 0 | pad to 4 KiB | chunk of bucket 1 | pad | ...
//
// A chunk is in memory only while it is used, in one of `buffer_count` aligned buffers:
//   read   just before the bucket's allgather (zero/partitioned_parameters.h), copied into the
//          gathered buffer, and the buffer is free again;
//   swap_in / swap_out   for the optimizer step: read (or, when the step overwrites every element,
//          as a mixed-precision step's compute copy does, not read), updated in place, written back
//          asynchronously: the next bucket's chunk is read and stepped while it is written.
// A read of a chunk waits for a write of it still in flight, so no one reads stale values. The
// files are created (a stale one from a killed run taken over, never read), locked while open and
// removed on destruction; a failed transfer throws naming the file.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "csrc/aio/async_io.h"
#include "offload/options.h"

namespace tessera {

struct ParameterSwapOptions {
  std::string path;                     // offload_param.nvme_path: an existing, writable directory
  int buffer_count = kParameterSwapBufferCount;      // offload_param.buffer_count (at least 1)
  int64_t buffer_numel = kParameterSwapBufferNumel;  // offload_param.buffer_size: at least the largest chunk
  AioOptions aio;                       // the aio section
  int rank = 0;                         // names the files
};

class ParameterSwapper {
 public:
  explicit ParameterSwapper(ParameterSwapOptions options);
  ~ParameterSwapper();

  // Registers group `group`: this rank's chunk of each of its buckets, `chunk_numel[b]` elements of
  // `dtype`. Call for every partitioned group before create_files().
  void add_group(int group, const std::vector<int64_t>& chunk_numel, at::ScalarType dtype);
  // Fails, naming the key, the path and the bytes, when the directory is unusable, short of space,
  // or buffer_size is below the largest chunk; then creates the files. Call once.
  void create_files();

  // Synchronous transfers of one chunk from or to any tensor of its size and dtype.
  void read(int group, int bucket, const at::Tensor& out);
  void write(int group, int bucket, const at::Tensor& values);
  // The chunk in a buffer of its own, to update in place (`fill`: read its values; false when the
  // caller overwrites all of them); swap_out writes it back asynchronously and frees the buffer.
  at::Tensor swap_in(int group, int bucket, bool fill = true);
  void swap_out(int group, int bucket);
  // Every write done; a failed one throws here.
  void wait_all();
  // After a failure: every buffer a caller holds is let go without being written.
  void release_all();

  int64_t resident_bytes() const;  // the buffers: all of the parameters' shard held in memory
  int64_t file_bytes() const;      // on disk, all groups
  int64_t bytes_read() const;
  int64_t bytes_written() const;
  const std::string& file_of(int group) const;

 private:
  struct Chunk {
    int64_t numel = 0;
    int64_t file_offset = 0;
  };
  struct Group {
    std::vector<Chunk> chunks;
    at::ScalarType dtype = at::kFloat;
    int64_t file_bytes = 0;
    std::string path;
    std::unique_ptr<AioFile> file;
  };
  struct Buffer {
    AlignedBuffer memory;
    int group = -1, bucket = -1;   // the chunk it holds for a caller (swap_in), or -1
    int writing_group = -1, writing_bucket = -1;
    AsyncIo::Ticket writing = 0;   // its chunk's write in flight
  };
  const Group& group(int index) const;
  int64_t chunk_bytes(const Group& g, int bucket) const;
  int take_buffer();  // a buffer no caller holds, its write done
  void wait_for_write_of(int group, int bucket);
  at::Tensor view(int buffer, const Group& g, int bucket) const;

  ParameterSwapOptions options_;
  std::vector<std::unique_ptr<Group>> groups_;  // by group index (null where not registered)
  std::vector<Buffer> buffers_;
  int next_buffer_ = 0;
  int64_t largest_chunk_bytes_ = 0, largest_chunk_numel_ = 0;
  std::unique_ptr<AsyncIo> io_;  // last: destroyed first, so no transfer outlives a buffer or file
};

}  // namespace tessera
