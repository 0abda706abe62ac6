// NVMe optimizer offload (ZeRO-Infinity's optimizer half, Rajbhandari et al. 2021): the optimizer's
// state arrays (Adam's m and v) and, with mixed precision, the fp32 master shard live in one file
// per parameter group and rank under `nvme_path`, never whole in memory.
//
// Each segment of a group's shard (one per bucket) is cut into tiles of at most `tile_numel`
// elements (DeepSpeed's sub_group_size), a large segment into at least 8 (offload/swap_tiles.h:
// reads, steps and writes overlap only across tiles). A tile's slot in the file holds its arrays packed
// [state 0 | state 1 | ... | master], aligned to 4096 bytes for O_DIRECT. A step streams the tiles
// through `buffer_count` tile buffers:
//
//     read tile k+1 .. k+B−1 (pipeline_read;   step tile k   write tile k (waited at once unless
//     k+B−2 with pipeline_write)                              pipeline_write)
//
// so the optimizer state held in memory is B tiles, not the shard. Without a master in the file
// (fp32 training) nothing is written before the first step, which starts from zeros (DeepSpeed's
// fast_init). The files are created (or a
// stale one from a killed run truncated) and locked at construction, and removed when the swapper
// is destroyed; a failed transfer throws naming the file, so training stops before a step's
// half-written state could be used.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "csrc/aio/async_io.h"
#include "offload/options.h"
#include "optim/shard.h"

namespace tessera {

struct OptimizerSwapOptions {
  std::string path;                 // offload_optimizer.nvme_path: an existing, writable directory
  int64_t tile_numel = kOptimizerSwapTileNumel;  // zero_optimization.sub_group_size
  int buffer_count = kOptimizerSwapBufferCount;  // offload_optimizer.buffer_count (at least 1)
  bool pipeline_read = false;       // offload_optimizer.pipeline_read: read ahead of the step
  bool pipeline_write = false;      // offload_optimizer.pipeline_write: write behind it
  AioOptions aio;                   // the aio section
  int rank = 0;                     // names the files: several ranks may share one directory
};

class OptimizerSwapper {
 public:
  explicit OptimizerSwapper(OptimizerSwapOptions options);
  ~OptimizerSwapper();

  // Registers group `group` with its segments (their gradient views and offsets are kept; the
  // parameter views are asked for at each step), `state_arrays` fp32 arrays
  // of optimizer state (zero at first), and `master`, this rank's fp32 master shard whose values
  // go to the file (undefined: the parameters stay in memory, fp32 training). Call for every group
  // before check_space(); returns the group's file bytes.
  int64_t add_group(int group, const std::vector<ShardSegment>& segments, int state_arrays, const at::Tensor& master);
  // Fails, naming the path and the bytes needed against the bytes free, when the files will not
  // fit; then creates and fills the files (zeros and the master values). Call once.
  void create_files();

  // Steps `order`'s segments, (group, segment index) pairs, tile by tile: `segment_of` gives a
  // segment's views (its parameters and compute copy) before its first tile; `step_tile` gets the
  // tile as a segment (its params the master in the tile buffer when offloaded) and its state
  // arrays, which cover shard elements [tile.local_offset, + numel); `segment_done` is called when
  // a segment's last tile is stepped (its compute copy is then final: an allgather can start).
  // A step that throws (a failed transfer) leaves the files in no defined state: the engine stops
  // training, and the swapper must not be stepped again.
  using TileStep = std::function<void(int group, const ShardSegment& tile, const std::vector<at::Tensor>& state)>;
  using SegmentOf = std::function<ShardSegment(int group, int segment)>;
  void step(const std::vector<std::pair<int, int>>& order, const SegmentOf& segment_of, const TileStep& step_tile,
            const std::function<void(int group, int segment)>& segment_done);

  // Checkpoints: group `group`'s state arrays and (when in the file) master, each shard-long fp32
  // on the host, laid out like the shard (segment by segment at its local offset; zeros before
  // the first step of an fp32 group); and all of them written back.
  std::vector<at::Tensor> read_arrays(int group);
  void write_arrays(int group, const std::vector<at::Tensor>& arrays);
  // Overwrites the master values of a segment in the file (GatheredParameters' write-back).
  void write_master(int group, int segment, const at::Tensor& values);

  int64_t resident_bytes() const;  // the tile buffers: all the optimizer state held in memory
  int64_t file_bytes() const;      // on disk, all groups
  int64_t bytes_read() const;
  int64_t bytes_written() const;
  const std::string& file_of(int group) const;
  AioBackend backend() const;

 private:
  struct Tile {
    int64_t begin = 0;  // in the segment
    int64_t numel = 0;
    int64_t file_offset = 0;
  };
  struct Group {
    std::vector<ShardSegment> segments;
    std::vector<std::vector<Tile>> tiles;  // per segment
    int state_arrays = 0;
    bool master_on_file = false;
    at::Tensor initial_master;  // until create_files()
    int64_t file_bytes = 0;
    bool fresh = false;  // nothing written yet: the first step reads zeros from memory
    std::string path;
    std::unique_ptr<AioFile> file;
  };
  struct TileRef {
    int group, segment, tile;
  };
  int arrays(const Group& g) const { return g.state_arrays + (g.master_on_file ? 1 : 0); }
  int64_t slot_bytes(const Group& g, int64_t numel) const { return aio_aligned(4 * numel * arrays(g)); }
  // Views of buffer `b` holding tile `t` of group `g`: the state arrays, then the master.
  std::vector<at::Tensor> views(const Group& g, int64_t numel, int buffer) const;
  const Group& group(int index) const;

  OptimizerSwapOptions options_;
  std::vector<std::unique_ptr<Group>> groups_;  // by group index (null where not registered)
  std::vector<AlignedBuffer> buffers_;
  int64_t largest_slot_ = 0;
  std::unique_ptr<AsyncIo> io_;  // last: destroyed first, so no transfer outlives a buffer or file
};

}  // namespace tessera
