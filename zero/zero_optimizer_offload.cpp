// ZeroOptimizer's NVMe offload: the optimizer state and master in the optimizer swapper's files
// (offload/optimizer_swapper.h), and at ZeRO-3 the partitioned parameter shards in the parameter
// swapper's (offload/parameter_swapper.h): moved there at construction, bound bucket by bucket
// around the optimizer step, brought whole into memory for the scopes that need them
// (ResidentParameters), read and written for checkpoints.
#include "zero/zero_optimizer.h"

#include <ATen/ops/empty.h>

#include <exception>
#include <stdexcept>
#include <vector>

namespace tessera {

// NVMe optimizer offload: every group's state (and fp32 master) moves to its file; the optimizer
// keeps none, and the master's memory goes as soon as its values are written. On GPU ranks the
// tiles step the host segments (host_optimizer_): the host copy of the gradient shard, and in fp32
// the host copy of the parameters, which stays in host memory as the CPU ranks' parameters do.
void ZeroOptimizer::offload_optimizer_states(const OptimizerSwapOptions& options) {
  swapper_ = std::make_unique<OptimizerSwapper>(options);
  for (auto& g : groups_) swapper_->add_group(g->index, stepped_segments(*g), g->optimizer->state_arrays(), g->master);
  swapper_->create_files();
  for (auto& g : groups_) {
    if (!g->master.defined()) continue;
    g->master = at::Tensor();
    g->master_on_file = true;
    // The views held the master alive.
    for (ShardSegment& s : g->segments) s.params = at::Tensor();
    for (ShardSegment& s : g->host_segments) s.params = at::Tensor();
  }
}

std::vector<at::Tensor> ZeroOptimizer::read_offloaded_state(int group) { return swapper_->read_arrays(group); }

void ZeroOptimizer::write_offloaded_state(int group, const std::vector<at::Tensor>& arrays) {
  ResidentParameters resident(*this);  // the compute copy follows a master
  swapper_->write_arrays(group, arrays);
  ZeroGroup& g = *groups_.at(group);
  if (g.master_on_file)
    for (ShardSegment& s : g.segments) s.compute_copy.copy_(arrays.back().narrow(0, s.local_offset, s.compute_copy.numel()));
}

// NVMe parameter offload: each partitioned group's shard goes to its file, chunk by chunk, and its
// memory with it; the optimizer and the gathers swap a bucket's chunk in when they need it.
void ZeroOptimizer::offload_parameters(const ParameterSwapOptions& options) {
  auto swapper = std::make_unique<ParameterSwapper>(options);
  bool any = false;
  for (auto& g : groups_) {
    if (!g->partitioned) continue;
    std::vector<int64_t> chunks;
    for (const FlatBucket& k : g->layout.buckets) chunks.push_back(k.shard);
    swapper->add_group(g->index, chunks, g->compute.scalar_type());
    any = true;
  }
  if (!any) return;  // every parameter is persistent: nothing is partitioned, nothing to offload
  swapper->create_files();
  param_swapper_ = std::move(swapper);
  for (auto& g : groups_)
    if (g->partitioned) {
      g->parameters_on_file = true;
      put_parameters_back_group(*g);
    }
}

ZeroOptimizer::ResidentParameters::ResidentParameters(ZeroOptimizer& zero, bool modifies)
    : zero_(zero), exceptions_(std::uncaught_exceptions()) {
  zero_.bring_parameters_in(modifies);
}

ZeroOptimizer::ResidentParameters::~ResidentParameters() noexcept(false) {
  if (std::uncaught_exceptions() == exceptions_) {
    zero_.put_parameters_back();
    return;
  }
  try {  // unwinding already: a second error must not terminate
    zero_.put_parameters_back();
  } catch (const std::exception&) {
  }
}

// The segments' parameter views (the fp32 values in fp32 training, else the compute copy) point
// into `compute`, or are unbound while it is in the file.
void ZeroOptimizer::bind_views(ZeroGroup& g, const at::Tensor& shard, int bucket) {
  ShardSegment& s = g.segments[bucket];
  if (g.mixed()) s.compute_copy = shard;
  else s.params = shard;
}

void ZeroOptimizer::bring_parameters_in(bool modifies) {
  if (!param_swapper_) return;
  if (resident_depth_ == 0) {
    for (auto& g : groups_) {
      if (!g->parameters_on_file) continue;
      try {
        bring_group_in(*g);
      } catch (...) {  // nothing stays half in memory: the scope was not opened
        for (auto& h : groups_)
          if (h->parameters_on_file && h->compute.defined()) drop_group(*h);
        throw;
      }
    }
    resident_modified_ = false;
  }
  ++resident_depth_;
  resident_modified_ = resident_modified_ || modifies;
}

void ZeroOptimizer::put_parameters_back() {
  if (!param_swapper_ || resident_depth_ == 0 || --resident_depth_ > 0) return;
  for (auto& g : groups_) {
    if (!g->parameters_on_file) continue;
    if (resident_modified_) put_parameters_back_group(*g);
    else drop_group(*g);
  }
}

void ZeroOptimizer::bring_group_in(ZeroGroup& g) {
  g.compute = at::empty({g.layout.shard_numel}, g.params.front().options().dtype(g.params.front().scalar_type()));
  for (size_t b = 0; b < g.layout.buckets.size(); ++b) {
    const FlatBucket& k = g.layout.buckets[b];
    at::Tensor chunk = g.compute.narrow(0, k.shard_offset, k.shard);
    param_swapper_->read(g.index, static_cast<int>(b), chunk);
    bind_views(g, chunk, static_cast<int>(b));
  }
}

void ZeroOptimizer::drop_group(ZeroGroup& g) {
  for (size_t b = 0; b < g.layout.buckets.size(); ++b) bind_views(g, at::Tensor(), static_cast<int>(b));
  g.compute = at::Tensor();
}

void ZeroOptimizer::put_parameters_back_group(ZeroGroup& g) {
  try {
    for (size_t b = 0; b < g.layout.buckets.size(); ++b) {
      const FlatBucket& k = g.layout.buckets[b];
      param_swapper_->write(g.index, static_cast<int>(b), g.compute.narrow(0, k.shard_offset, k.shard));
    }
    param_swapper_->wait_all();
  } catch (...) {
    drop_group(g);  // its memory goes either way; the failed write stops training
    throw;
  }
  drop_group(g);
}

ShardSegment ZeroOptimizer::bind_segment(ZeroGroup& g, int bucket) {
  if (!swapped(g)) return stepped_segments(g)[bucket];
  // A mixed-precision step writes the whole compute copy from the master: nothing to read first.
  bind_views(g, param_swapper_->swap_in(g.index, bucket, /*fill=*/!g.mixed()), bucket);
  return g.segments[bucket];
}


// One bucket of a group whose shard is in the file: swapped in, stepped, written back behind.
void ZeroOptimizer::step_swapped_segment(ZeroGroup& g, int bucket, const StepInputs& in) {
  try {
    g.optimizer->step(in, {bind_segment(g, bucket)});
  } catch (...) {
    abandon_swapped_segments();
    throw;
  }
  unbind_segment(g, bucket);
  if (host_optimizer_) copy_chunk_to_device(g, bucket);
}

// A step that failed: the buffers its chunks were swapped into are let go unwritten (the step is
// lost and training stops) and no view points into them any more.
void ZeroOptimizer::abandon_swapped_segments() {
  if (!param_swapper_) return;
  for (auto& g : groups_)
    if (swapped(*g))
      for (size_t b = 0; b < g->segments.size(); ++b) bind_views(*g, at::Tensor(), static_cast<int>(b));
  param_swapper_->release_all();
}

void ZeroOptimizer::unbind_segment(ZeroGroup& g, int bucket) {
  const ShardSegment& s = g.segments[bucket];
  if (!swapped(g) || !(g.mixed() ? s.compute_copy : s.params).defined()) return;  // never bound (no tiles here)
  param_swapper_->swap_out(g.index, bucket);
  bind_views(g, at::Tensor(), bucket);
}

}  // namespace tessera
