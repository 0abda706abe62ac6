// The NVMe residences (zero/residence.h; ZeRO-Infinity, Rajbhandari et al. 2021):
//   StateInFiles       the optimizer state (and with mixed precision the fp32 master) in the
//                      optimizer swapper's files, streamed through tile buffers at each step
//                      (offload/optimizer_swapper.h); the optimizers are built without state.
//   ParametersInFiles  at ZeRO-3 each partitioned group's shard in the parameter swapper's files
//                      (offload/parameter_swapper.h), its memory gone: a bucket's chunk is read
//                      just before its gather and swapped in around its step; what needs the shard
//                      whole (checkpoints, LAMB) brings it into memory for a while.
#include <ATen/ops/empty.h>

#include <stdexcept>
#include <string>

#include "zero/residence.h"

namespace tessera {
namespace {

class StateInFiles final : public StateSite {
 public:
  explicit StateInFiles(const OptimizerSwapOptions& options) : swapper_(options) {}

  bool in_files() const override { return true; }

  // Every group's state (and fp32 master) moves to its file; the master's memory goes as soon as
  // its values are written. On GPU ranks the tiles step the host segments (HostStep).
  void attach(Groups& groups, StepSite& site) override {
    tiles_on_host_ = site.on_host();
    for (auto& g : groups) swapper_.add_group(g->index, site.segments(*g), g->optimizer->state_arrays(), g->master);
    swapper_.create_files();
    for (auto& g : groups) {  // with mixed precision the master goes to the file (master_in_file)
      if (!g->master.defined()) continue;
      g->master = at::Tensor();
      for (ShardSegment& s : g->segments) s.params = at::Tensor();  // the views held the master alive
      site.release_master_views(*g);
    }
  }

  void step(const BucketOrder& order, const BindBucket& bind, const StepPiece& step, const BucketDone& done) override {
    swapper_.step(order, bind, step, done);
  }

  void write_master(ZeroGroup& g, int bucket, const at::Tensor& values) override {
    if (master_in_file(g)) swapper_.write_master(g.index, bucket, values);
    else StateSite::write_master(g, bucket, values);
  }

  void compute_follows_master(ZeroGroup& g) override {
    if (!master_in_file(g)) StateSite::compute_follows_master(g);  // else write() did it
  }

  CheckpointState read(const ZeroGroup& g) override {
    CheckpointState state;
    state.named = g.optimizer->named_state();
    state.arrays = swapper_.read_arrays(g.index);  // in the optimizer's state order, the master last
    state.from_files = true;
    const size_t states = state.arrays.size() - (master_in_file(g) ? 1 : 0);
    if (state.named.size() != states)
      throw std::logic_error("tessera: the swap file holds " + std::to_string(states) + " state arrays, " +
                             g.optimizer->name() + " names " + std::to_string(state.named.size()));
    for (size_t k = 0; k < states; ++k) state.named[k].second = state.arrays[k];
    if (master_in_file(g)) state.master = state.arrays.back();
    return state;
  }

  void write(ZeroGroup& g, const std::vector<at::Tensor>& arrays) override {
    swapper_.write_arrays(g.index, arrays);
    if (master_in_file(g))  // the compute copy follows the master
      for (ShardSegment& s : g.segments)
        s.compute_copy.copy_(arrays.back().narrow(0, s.local_offset, s.compute_copy.numel()));
  }

  // Every mixed-precision group's master is in its file (attach moved it); fp32 groups have none.
  bool master_in_file(const ZeroGroup& g) const override { return g.mixed(); }

  void add_memory(MemoryReport& m) const override {
    (tiles_on_host_ ? m.host_optimizer_bytes : m.optimizer_states) += swapper_.resident_bytes();  // the tile buffers
    m.offloaded_optimizer_bytes = swapper_.file_bytes();
    m.offload_read_bytes += swapper_.bytes_read();
    m.offload_written_bytes += swapper_.bytes_written();
  }

 private:
  OptimizerSwapper swapper_;
  bool tiles_on_host_ = false;  // the step site's: host memory on GPU ranks
};

class ParametersInFiles final : public ParameterSite {
 public:
  ParametersInFiles(const ParameterSwapOptions& options, bool buffers_on_host)
      : options_(options), buffers_on_host_(buffers_on_host) {}

  void attach(Groups& groups) override {
    auto swapper = std::make_unique<ParameterSwapper>(options_);
    bool any = false;
    for (auto& g : groups) {
      if (!g->partitioned) continue;
      std::vector<int64_t> chunks;
      for (const FlatBucket& k : g->layout.buckets) chunks.push_back(k.shard);
      swapper->add_group(g->index, chunks, g->compute.scalar_type());
      any = true;
    }
    if (!any) return;  // every parameter is persistent: nothing is partitioned, nothing to offload
    swapper->create_files();
    swapper_ = std::move(swapper);
    for (auto& g : groups)
      if (g->partitioned) put_back_group(*g);
  }

  bool in_files(const ZeroGroup& g) const override { return on_file(g) && !g.compute.defined(); }

  void bind(ZeroGroup& g, int bucket) override {
    if (!in_files(g)) return;
    // A mixed-precision step writes the whole compute copy from the master: nothing to read first.
    bind_views(g, swapper_->swap_in(g.index, bucket, /*fill=*/!g.mixed()), bucket);
  }

  void unbind(ZeroGroup& g, int bucket) override {
    const ShardSegment& s = g.segments[bucket];
    if (!in_files(g) || !(g.mixed() ? s.compute_copy : s.params).defined()) return;  // never bound
    swapper_->swap_out(g.index, bucket);
    bind_views(g, at::Tensor(), bucket);
  }

  // The buffers the chunks were swapped into are let go unwritten (the step is lost and training
  // stops) and no view points into them any more.
  void abandon(Groups& groups) override {
    if (!swapper_) return;
    for (auto& g : groups)
      if (in_files(*g))
        for (size_t b = 0; b < g->segments.size(); ++b) bind_views(*g, at::Tensor(), static_cast<int>(b));
    swapper_->release_all();
  }

  void with_group_resident(ZeroGroup& g, const std::function<void()>& step) override {
    if (!in_files(g)) {
      step();
      return;
    }
    bring_group_in(g);
    try {
      step();
    } catch (...) {
      drop_group(g);
      throw;
    }
    put_back_group(g);
  }

  void bring_in(Groups& groups, bool modifies) override {
    if (!swapper_) return;
    if (depth_ == 0) {
      for (auto& g : groups) {
        if (!on_file(*g)) continue;
        try {
          bring_group_in(*g);
        } catch (...) {  // nothing stays half in memory: the scope was not opened
          for (auto& h : groups)
            if (on_file(*h) && h->compute.defined()) drop_group(*h);
          throw;
        }
      }
      modified_ = false;
    }
    ++depth_;
    modified_ = modified_ || modifies;
  }

  void put_back(Groups& groups) override {
    if (!swapper_ || depth_ == 0 || --depth_ > 0) return;
    for (auto& g : groups) {
      if (!on_file(*g)) continue;
      if (modified_) put_back_group(*g);
      else drop_group(*g);
    }
  }

  void write(ZeroGroup& g, int bucket, const at::Tensor& values) override {
    if (in_files(g)) swapper_->write(g.index, bucket, values);
    else ParameterSite::write(g, bucket, values);
  }

  void wait_writes() override {
    if (swapper_) swapper_->wait_all();  // a failed write stops training here
  }

  ParameterSwapper* swapper() override { return swapper_.get(); }

  void add_memory(MemoryReport& m) const override {
    if (!swapper_) return;
    // Its buffers: what of the shards is in memory (the host's, beside a GPU).
    (buffers_on_host_ ? m.host_parameter_bytes : m.parameters) += swapper_->resident_bytes();
    m.offloaded_parameter_bytes = swapper_->file_bytes();
    m.offload_read_bytes += swapper_->bytes_read();
    m.offload_written_bytes += swapper_->bytes_written();
  }

 private:
  // Every partitioned group's shard has its file once attach() found one.
  bool on_file(const ZeroGroup& g) const { return swapper_ && g.partitioned; }
  // The segments' parameter views (the fp32 values in fp32 training, else the compute copy) point
  // into the shard, or are unbound while it is in the file.
  static void bind_views(ZeroGroup& g, const at::Tensor& shard, int bucket) {
    ShardSegment& s = g.segments[bucket];
    if (g.mixed()) s.compute_copy = shard;
    else s.params = shard;
  }
  void bring_group_in(ZeroGroup& g) {  // its shard read into a host `compute` buffer, views bound
    g.compute = at::empty({g.layout.shard_numel}, at::TensorOptions().dtype(g.params.front().scalar_type()));
    for (size_t b = 0; b < g.layout.buckets.size(); ++b) {
      const FlatBucket& k = g.layout.buckets[b];
      at::Tensor chunk = g.compute.narrow(0, k.shard_offset, k.shard);
      swapper_->read(g.index, static_cast<int>(b), chunk);
      bind_views(g, chunk, static_cast<int>(b));
    }
  }
  void drop_group(ZeroGroup& g) {  // its memory freed, nothing written
    for (size_t b = 0; b < g.layout.buckets.size(); ++b) bind_views(g, at::Tensor(), static_cast<int>(b));
    g.compute = at::Tensor();
  }
  void put_back_group(ZeroGroup& g) {  // its shard to the file, and its memory freed
    try {
      for (size_t b = 0; b < g.layout.buckets.size(); ++b) {
        const FlatBucket& k = g.layout.buckets[b];
        swapper_->write(g.index, static_cast<int>(b), g.compute.narrow(0, k.shard_offset, k.shard));
      }
      swapper_->wait_all();
    } catch (...) {
      drop_group(g);  // its memory goes either way; the failed write stops training
      throw;
    }
    drop_group(g);
  }

  ParameterSwapOptions options_;
  bool buffers_on_host_;
  std::unique_ptr<ParameterSwapper> swapper_;  // null until attach() found a partitioned group
  int depth_ = 0;                              // ResidentParameters scopes open
  bool modified_ = false;                      // one of them writes the shards
};

}  // namespace

std::unique_ptr<StateSite> make_state_in_files(const OptimizerSwapOptions& options) {
  return std::make_unique<StateInFiles>(options);
}

std::unique_ptr<ParameterSite> make_parameters_in_files(const ParameterSwapOptions& options, bool buffers_on_host) {
  return std::make_unique<ParametersInFiles>(options, buffers_on_host);
}

}  // namespace tessera
