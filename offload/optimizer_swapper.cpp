#include "offload/optimizer_swapper.h"

#include "offload/swap_directory.h"
#include "offload/swap_tiles.h"

#include <ATen/ops/zeros.h>

#include <ATen/ops/from_blob.h>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace tessera {

OptimizerSwapper::OptimizerSwapper(OptimizerSwapOptions options) : options_(std::move(options)) {
  if (options_.tile_numel < 1) throw std::invalid_argument("tessera: sub_group_size must be at least 1");
  options_.buffer_count = std::max(options_.buffer_count, 1);
}

OptimizerSwapper::~OptimizerSwapper() {
  // The I/O thread drains before the buffers and files it uses go (io_ is declared last).
  if (io_) {
    try {
      io_->wait_all();
    } catch (const std::exception&) {
    }
  }
}

const OptimizerSwapper::Group& OptimizerSwapper::group(int index) const {
  if (index < 0 || index >= static_cast<int>(groups_.size()) || !groups_[index])
    throw std::logic_error("tessera: optimizer swapper: group " + std::to_string(index) + " is not registered");
  return *groups_[index];
}

int64_t OptimizerSwapper::add_group(int index, const std::vector<ShardSegment>& segments, int state_arrays,
                                    const at::Tensor& master) {
  if (io_) throw std::logic_error("tessera: optimizer swapper: add_group after create_files");
  if (index >= static_cast<int>(groups_.size())) groups_.resize(index + 1);
  auto g = std::make_unique<Group>();
  // Only the gradients and offsets are kept: the parameter views come from the caller at each
  // step (they may live in a file too, offload/parameter_swapper.h), and kept views of the master
  // or the compute buffer would hold them alive.
  for (const ShardSegment& seg : segments) {
    ShardSegment kept;
    kept.grads = seg.grads;
    kept.local_offset = seg.local_offset;
    g->segments.push_back(std::move(kept));
  }
  g->state_arrays = state_arrays;
  g->master_on_file = master.defined();
  g->initial_master = master;
  g->path = options_.path + "/tessera-optimizer-rank" + std::to_string(options_.rank) + "-group" +
            std::to_string(index) + ".swp";
  for (const ShardSegment& s : segments) {
    std::vector<Tile> tiles;
    const int64_t n = s.grads.numel();
    const int64_t tile = optimizer_swap_tile_numel(options_.tile_numel, n);
    for (int64_t begin = 0; begin < n; begin += tile) {
      Tile t;
      t.begin = begin;
      t.numel = std::min(tile, n - begin);
      t.file_offset = g->file_bytes;
      g->file_bytes += slot_bytes(*g, t.numel);
      largest_slot_ = std::max(largest_slot_, slot_bytes(*g, t.numel));
      tiles.push_back(t);
    }
    g->tiles.push_back(std::move(tiles));
  }
  const int64_t bytes = g->file_bytes;
  groups_[index] = std::move(g);
  return bytes;
}

void OptimizerSwapper::create_files() {
  if (io_) throw std::logic_error("tessera: optimizer swapper: create_files called twice");
  check_swap_directory("zero_optimization.offload_optimizer.nvme_path", options_.path, file_bytes(),
                       "this rank's optimizer swap files");
  for (int i = 0; i < options_.buffer_count; ++i) buffers_.emplace_back(largest_slot_);
  io_ = AsyncIo::create(options_.aio);
  for (auto& gp : groups_) {
    if (!gp) continue;
    Group& g = *gp;
    g.file = std::make_unique<AioFile>(AioFile::create(g.path));
    if (g.file->replaced_stale())
      std::fprintf(stderr, "[tessera] rank %d: replacing the stale optimizer swap file %s (from a run that did not "
                   "exit normally; its contents are not read)\n", options_.rank, g.path.c_str());
    // The master's values (after zeros for the state), tile by tile. Without a master nothing is
    // written before the first step, which starts from zeros in memory.
    g.fresh = !g.master_on_file;
    for (size_t s = 0; s < g.tiles.size() && g.master_on_file; ++s)
      for (const Tile& t : g.tiles[s]) {
        std::memset(buffers_[0].data(), 0, static_cast<size_t>(slot_bytes(g, t.numel)));
        if (g.master_on_file)
          views(g, t.numel, 0).back().copy_(g.initial_master.narrow(0, g.segments[s].local_offset + t.begin, t.numel));
        io_->wait(io_->write(*g.file, buffers_[0].data(), slot_bytes(g, t.numel), t.file_offset));
      }
    g.initial_master = at::Tensor();
  }
}

std::vector<at::Tensor> OptimizerSwapper::views(const Group& g, int64_t numel, int buffer) const {
  auto* base = static_cast<float*>(buffers_[buffer].data());
  std::vector<at::Tensor> v;
  for (int a = 0; a < arrays(g); ++a) v.push_back(at::from_blob(base + a * numel, {numel}, at::kFloat));
  return v;
}

void OptimizerSwapper::step(const std::vector<std::pair<int, int>>& order, const SegmentOf& segment_of,
                            const TileStep& step_tile, const std::function<void(int, int)>& segment_done) {
  if (!io_) throw std::logic_error("tessera: optimizer swapper: step before create_files");
  std::vector<TileRef> tiles;
  for (const auto& [gi, s] : order) {
    const Group& g = group(gi);
    for (size_t t = 0; t < g.tiles[s].size(); ++t) tiles.push_back({gi, s, static_cast<int>(t)});
    if (g.tiles[s].empty()) segment_done(gi, s);  // nothing of it on this rank (every rank alike)
  }
  const size_t buffers = buffers_.size();
  std::vector<AsyncIo::Ticket> reading(buffers, 0), writing(buffers, 0);
  auto tile_of = [&](const TileRef& r) -> const Tile& { return group(r.group).tiles[r.segment][r.tile]; };
  auto issue_read = [&](size_t j) {
    const size_t b = j % buffers;
    if (writing[b]) io_->wait(std::exchange(writing[b], 0));  // tile j − buffers is still being written
    const Group& g = group(tiles[j].group);
    const Tile& t = tile_of(tiles[j]);
    if (g.fresh) std::memset(buffers_[b].data(), 0, static_cast<size_t>(slot_bytes(g, t.numel)));
    else reading[b] = io_->read(*g.file, buffers_[b].data(), slot_bytes(g, t.numel), t.file_offset);
  };
  // Read ahead by up to buffers − 1 tiles (pipeline_read), or only the tile about to be stepped;
  // with write-behind one buffer fewer, or each read would wait for the write just issued.
  const size_t spare = options_.pipeline_write ? 2 : 1;
  const size_t ahead = options_.pipeline_read && buffers > spare ? buffers - spare : 0;
  size_t next_read = 0;
  ShardSegment seg;  // the segment being stepped, as the caller gave it at its first tile
  try {
    for (size_t k = 0; k < tiles.size(); ++k) {
      while (next_read < tiles.size() && next_read <= k + ahead) issue_read(next_read++);
      const size_t b = k % buffers;
      if (reading[b]) io_->wait(std::exchange(reading[b], 0));
      const TileRef& r = tiles[k];
      const Group& g = group(r.group);
      const Tile& t = tile_of(r);
      if (r.tile == 0) seg = segment_of(r.group, r.segment);
      std::vector<at::Tensor> v = views(g, t.numel, static_cast<int>(b));
      ShardSegment tile;
      tile.grads = seg.grads.narrow(0, t.begin, t.numel);
      tile.local_offset = seg.local_offset + t.begin;
      if (seg.compute_copy.defined()) tile.compute_copy = seg.compute_copy.narrow(0, t.begin, t.numel);
      tile.params = g.master_on_file ? v.back() : seg.params.narrow(0, t.begin, t.numel);
      v.resize(g.state_arrays);
      step_tile(r.group, tile, v);
      writing[b] = io_->write(*g.file, buffers_[b].data(), slot_bytes(g, t.numel), t.file_offset);
      if (!options_.pipeline_write) io_->wait(std::exchange(writing[b], 0));
      if (r.tile + 1 == static_cast<int>(g.tiles[r.segment].size())) {
        seg = ShardSegment();
        segment_done(r.group, r.segment);
      }
    }
    io_->wait_all();
    for (const auto& [gi, s] : order) groups_[gi]->fresh = false;
  } catch (...) {
    try {
      io_->wait_all();  // nothing in flight into the buffers once this returns
    } catch (const std::exception&) {
    }
    throw;
  }
}

std::vector<at::Tensor> OptimizerSwapper::read_arrays(int index) {
  const Group& g = group(index);
  int64_t shard = 0;
  for (const ShardSegment& seg : g.segments) shard = std::max(shard, seg.local_offset + seg.grads.numel());
  std::vector<at::Tensor> out;
  for (int a = 0; a < arrays(g); ++a) out.push_back(at::zeros({shard}, at::kFloat));
  for (size_t s = 0; s < g.tiles.size(); ++s)
    for (const Tile& t : g.tiles[s]) {
      if (g.fresh) continue;
      io_->wait(io_->read(*g.file, buffers_[0].data(), slot_bytes(g, t.numel), t.file_offset));
      const std::vector<at::Tensor> v = views(g, t.numel, 0);
      for (int a = 0; a < arrays(g); ++a) out[a].narrow(0, g.segments[s].local_offset + t.begin, t.numel).copy_(v[a]);
    }
  return out;
}

void OptimizerSwapper::write_arrays(int index, const std::vector<at::Tensor>& values) {
  Group& g = *groups_.at(index);
  if (static_cast<int>(values.size()) != arrays(g))
    throw std::logic_error("tessera: optimizer swapper: write_arrays got " + std::to_string(values.size()) + " arrays, not " +
                           std::to_string(arrays(g)));
  for (size_t s = 0; s < g.tiles.size(); ++s)
    for (const Tile& t : g.tiles[s]) {
      std::memset(buffers_[0].data(), 0, static_cast<size_t>(slot_bytes(g, t.numel)));
      const std::vector<at::Tensor> v = views(g, t.numel, 0);
      for (int a = 0; a < arrays(g); ++a) v[a].copy_(values[a].narrow(0, g.segments[s].local_offset + t.begin, t.numel));
      io_->wait(io_->write(*g.file, buffers_[0].data(), slot_bytes(g, t.numel), t.file_offset));
    }
  g.fresh = false;  // every tile written
}

void OptimizerSwapper::write_master(int index, int segment, const at::Tensor& values) {
  const Group& g = group(index);
  if (!g.master_on_file) return;  // (a group with a master on file is never fresh)
  for (const Tile& t : g.tiles[segment]) {
    io_->wait(io_->read(*g.file, buffers_[0].data(), slot_bytes(g, t.numel), t.file_offset));
    views(g, t.numel, 0).back().copy_(values.narrow(0, t.begin, t.numel));
    io_->wait(io_->write(*g.file, buffers_[0].data(), slot_bytes(g, t.numel), t.file_offset));
  }
}

int64_t OptimizerSwapper::resident_bytes() const {
  int64_t total = 0;
  for (const AlignedBuffer& b : buffers_) total += b.capacity();
  return total;
}

int64_t OptimizerSwapper::file_bytes() const {
  int64_t total = 0;
  for (const auto& g : groups_)
    if (g) total += g->file_bytes;
  return total;
}

int64_t OptimizerSwapper::bytes_read() const { return io_ ? io_->bytes_read() : 0; }
int64_t OptimizerSwapper::bytes_written() const { return io_ ? io_->bytes_written() : 0; }
const std::string& OptimizerSwapper::file_of(int index) const { return group(index).path; }
AioBackend OptimizerSwapper::backend() const {
  if (!io_) throw std::logic_error("tessera: optimizer swapper: no I/O engine before create_files");
  return io_->backend();
}

}  // namespace tessera
