// ZeroOptimizer after construction (zero/zero_optimizer_build.cpp): the optimizer step on the
// shards, the parameter allgathers around it and their waits, the values written back to the
// model, state for checkpoints, and the memory report. The backward side (gradient hooks, bucket
// reductions) is zero/zero_optimizer_backward.cpp; NVMe offload zero/zero_optimizer_offload.cpp.
#include "zero/zero_optimizer.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "csrc/device_stream.h"
#include "parallel/parallel_context.h"
#include "zero/units.h"

namespace tessera {

ZeroOptimizer::~ZeroOptimizer() {
  if (units_) units_->remove_listener(this);
  // The parameters outlive the engine: they get their last values (unless a peer is gone).
  try {
    wait_for_parameters();
  } catch (const CommError&) {
    gathers_.clear();
  }
  // Reductions still in flight here were launched by a backward that threw or a step that failed:
  // waiting could block for the timeout per collective, and their results are not wanted.
  reductions_.drop();
  remove_grad_hooks();
}


void ZeroOptimizer::set_group_learning_rates(std::vector<double> lrs) {
  if (!lrs.empty())
    for (const auto& g : groups_)
      if (g->source_group >= static_cast<int>(lrs.size()))
        throw std::invalid_argument("tessera: set_group_learning_rates: " + std::to_string(lrs.size()) +
                                    " learning rates for a model of more parameter groups");
  group_lrs_ = std::move(lrs);
}

void ZeroOptimizer::apply(double grad_scale, const StepInputs& inputs) {
  std::vector<StepInputs> in(groups_.size(), inputs);
  for (auto& g : groups_) {
    in[g->index].lr = group_lrs_.empty() ? inputs.lr * g->lr_scale : group_lrs_[g->source_group];
    in[g->index].weight_decay = g->weight_decay;
    in[g->index].grad_scale = grad_scale;
  }
  // The gradient chunks' copies to the host, queued as their reductions completed, have landed.
  if (host_optimizer_) wait_for_device_stream(data_.device());
  if (swapper_) {
    // The state streams through tile buffers in the order the next forward reads the buckets;
    // each bucket's allgather starts when its last tile is stepped, as below.
    std::vector<std::pair<int, int>> order = gather_order_;
    if (stage_->number() == 0) {
      order.clear();
      for (auto& g : groups_)
        for (size_t b = 0; b < g->segments.size(); ++b) order.emplace_back(g->index, static_cast<int>(b));
    }
    try {
    swapper_->step(
        order, [&](int group, int bucket) { return bind_segment(*groups_[group], bucket); },
        [&](int group, const ShardSegment& tile, const std::vector<at::Tensor>& state) {
          groups_[group]->optimizer->step_with_state(in[group], {tile}, state, tile.local_offset);
        },
        [&](int group, int bucket) {
          unbind_segment(*groups_[group], bucket);
          if (host_optimizer_) copy_chunk_to_device(*groups_[group], bucket);  // before its allgather reads it
          if (stage_->gathers(*groups_[group]) && !groups_[group]->partitioned) launch_gather(*groups_[group], bucket);
        });
    } catch (...) {
      abandon_swapped_segments();
      throw;
    }
    if (param_swapper_) param_swapper_->wait_all();
    if (partitioned_) partitioned_->after_step();
    return;
  }
  // A group whose optimizer needs all its buckets at once (LAMB), or a stage that gathers
  // nothing, steps whole (this also writes the compute copy of this rank's chunks); with its
  // parameters in files, an elementwise one steps chunk by chunk instead, and LAMB has the shard
  // brought into memory for its step.
  for (auto& g : groups_) {
    if (stage_->gathers(*g) && g->optimizer->elementwise()) continue;
    if (!swapped(*g)) {
      g->optimizer->step(in[g->index], stepped_segments(*g));
      if (host_optimizer_)
        for (size_t b = 0; b < g->segments.size(); ++b) copy_chunk_to_device(*g, static_cast<int>(b));
    } else if (g->optimizer->elementwise()) {
      for (size_t b = 0; b < g->segments.size(); ++b) step_swapped_segment(*g, static_cast<int>(b), in[g->index]);
    } else {
      // LAMB's trust ratios need whole parameters: this group's shard in memory for its step.
      bring_group_in(*g);
      try {
        g->optimizer->step(in[g->index], g->segments);
      } catch (...) {
        drop_group(*g);
        throw;
      }
      put_parameters_back_group(*g);
    }
  }
  // Then bucket by bucket in the order the next forward reads them: each bucket's allgather runs
  // on the backend's thread while the optimizer updates the next one.
  for (const auto& [group, bucket] : gather_order_) {
    ZeroGroup& g = *groups_[group];
    if (!stage_->gathers(g)) continue;
    if (g.optimizer->elementwise()) step_swapped_segment(g, bucket, in[group]);
    if (!g.partitioned) launch_gather(g, bucket);  // stage 3's are gathered around their units
  }
  if (param_swapper_) param_swapper_->wait_all();  // a failed write stops training at this step
  if (partitioned_) partitioned_->after_step();  // the shards are updated: gathered copies are stale
}

void ZeroOptimizer::launch_gather(ZeroGroup& g, int bucket) {
  // No bound on what is in flight: the allgather runs in place (no buffer to bound), and a wait
  // here would hold the step until the next forward could have hidden it.
  gathers_.push_back({g.index, bucket, stage_->gather_bucket(g, bucket)});
  gathering_[g.index][bucket] = 1;
}

void ZeroOptimizer::wait_oldest_gather() {
  Gather gather = std::move(gathers_.front());
  gathers_.pop_front();
  gathering_[gather.group][gather.bucket] = 0;
  const auto start = std::chrono::steady_clock::now();
  gather.handle.wait();
  allgather_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void ZeroOptimizer::gather_parameters(bool model_reports_units) {
  if (!(overlap_allgather_ && model_reports_units && units_)) wait_for_parameters();
}

void ZeroOptimizer::wait_for_parameters() {
  while (!gathers_.empty()) wait_oldest_gather();
}

void ZeroOptimizer::on_unit_event(int unit, UnitEvent event) {
  if (event != UnitEvent::ForwardBegin || gathers_.empty() || unit >= static_cast<int>(unit_buckets_.size())) return;
  // The allgathers finish in launch order: wait up to the last one this unit reads.
  for (const auto& [group, bucket] : unit_buckets_[unit])
    while (gathering_[group][bucket]) wait_oldest_gather();
}

void ZeroOptimizer::write_back_parameters(int root) {
  wait_for_parameters();
  for (auto& gp : groups_)
    if (gp->comm != &data_)
      throw std::invalid_argument("tessera: parameters written on one data-parallel rank (modifier_rank " +
                                  std::to_string(root) + ") cannot reach group " + std::to_string(gp->index) +
                                  ", reduced over '" + gp->comm_name + "' rather than the data group: write its "
                                  "values on every rank (modifier_rank None)");
  for (auto& gp : groups_) {
    ZeroGroup& g = *gp;
    const int rank = stage_->shard_rank(g);
    for (size_t b = 0; b < g.layout.buckets.size(); ++b) {
      const FlatBucket& k = g.layout.buckets[b];
      at::Tensor whole = g.partitioned ? g.gathered[b] : g.compute.narrow(0, k.offset, k.numel);
      if (!whole.storage().data_ptr().get())
        throw std::logic_error("tessera: write_back_parameters needs every parameter gathered (Engine::gathered_parameters)");
      if (data_.size() > 1) data_.broadcast(whole, root);
      at::Tensor mine = whole.narrow(0, rank * k.shard, k.shard);
      if (swapped(g)) param_swapper_->write(g.index, static_cast<int>(b), mine);
      else if (g.partitioned) g.compute.narrow(0, k.shard_offset, k.shard).copy_(mine);
      if (g.master_on_file) swapper_->write_master(g.index, static_cast<int>(b), mine);
      else if (g.mixed()) g.master.narrow(0, k.shard_offset, k.shard).copy_(mine);
    }
    refresh_host_master(g);
  }
  if (param_swapper_) param_swapper_->wait_all();
}

void ZeroOptimizer::copy_chunk_to_device(ZeroGroup& g, int bucket) {
  const ShardSegment &host = g.host_segments[bucket], &device = g.segments[bucket];
  const at::Tensor& from = g.mixed() ? host.compute_copy : host.params;
  const at::Tensor& to = g.mixed() ? device.compute_copy : device.params;
  if (from.data_ptr() == to.data_ptr()) return;  // host_parameters: the shard is the host's already
  // From pinned memory: queued on the current stream; the next step's wait_for_device_stream
  // (before the CPU writes the host buffers again) orders the two.
  to.copy_(from, /*non_blocking=*/true);
}

void ZeroOptimizer::refresh_host_master(ZeroGroup& g) {
  if (!g.host_master.defined()) return;
  for (size_t b = 0; b < g.segments.size(); ++b) g.host_segments[b].params.copy_(g.segments[b].params);
}

bool ZeroOptimizer::has_groups_of_their_own() const {
  return std::any_of(groups_.begin(), groups_.end(), [&](const auto& g) { return g->comm != &data_; });
}

bool ZeroOptimizer::materialize_optimizer_state() {
  bool made = false;
  for (auto& g : groups_) made = g->optimizer->materialize_state() || made;
  return made;
}

void ZeroOptimizer::discard_materialized_optimizer_state() {
  for (auto& g : groups_) g->optimizer->discard_materialized_state();
}

void ZeroOptimizer::wait_for_host_readers() {
  if (host_optimizer_) wait_for_device_stream(data_.device());
}

void ZeroOptimizer::after_shards_loaded() {
  wait_for_parameters();
  ResidentParameters resident(*this);
  for (auto& g : groups_) {
    refresh_host_master(*g);  // fp32 training: the loaded values are the device's
    if (g->mixed() && !g->master_on_file)
      for (ShardSegment& s : g->segments) s.compute_copy.copy_(s.params);
    if (stage_->gathers(*g) && !g->partitioned)
      for (size_t b = 0; b < g->layout.buckets.size(); ++b) launch_gather(*g, static_cast<int>(b));
  }
  wait_for_parameters();
  if (partitioned_) partitioned_->after_step();
  zero_grad();
}

void ZeroOptimizer::zero_grad() {
  for (auto& g : groups_) g->grads.zero_();
}

std::string ZeroOptimizer::optimizer_phase() const {
  return groups_.empty() ? std::string() : groups_.front()->optimizer->phase();
}

std::vector<std::pair<std::string, at::Tensor>> ZeroOptimizer::optimizer_state() const {
  std::vector<std::pair<std::string, at::Tensor>> state;
  for (const auto& g : groups_)
    for (auto& [name, t] : g->optimizer->named_state()) state.emplace_back(std::to_string(g->index) + "." + name, t);
  return state;
}

MemoryReport ZeroOptimizer::memory() const {
  MemoryReport m;
  for (const auto& g : groups_) {
    if (g->compute.defined()) (host_parameters_ && g->partitioned ? m.host_parameter_bytes : m.parameters) += g->compute.nbytes();
    m.gradients += g->grads.nbytes();
    if (host_optimizer_) {  // pinned host memory, not the device's
      for (const at::Tensor* t : {&g->master, &g->host_master, &g->host_grads, &g->host_compute})
        if (t->defined()) m.host_optimizer_bytes += t->nbytes();
      m.host_optimizer_bytes += g->optimizer->state_bytes();
      continue;
    }
    if (g->master.defined()) m.master_parameters += g->master.nbytes();
    m.optimizer_states += g->optimizer->state_bytes();
  }
  if (swapper_) {
    // The tile buffers: host memory on GPU ranks.
    (host_optimizer_ ? m.host_optimizer_bytes : m.optimizer_states) += swapper_->resident_bytes();
    m.offloaded_optimizer_bytes = swapper_->file_bytes();
    m.offload_read_bytes = swapper_->bytes_read();
    m.offload_written_bytes = swapper_->bytes_written();
  }
  if (param_swapper_) {
    m.parameters += param_swapper_->resident_bytes();  // its buffers: what of the shards is in memory
    m.offloaded_parameter_bytes = param_swapper_->file_bytes();
    m.offload_read_bytes += param_swapper_->bytes_read();
    m.offload_written_bytes += param_swapper_->bytes_written();
  }
  if (partitioned_ && !groups_.empty()) {
    const int64_t element = groups_.front()->params.front().element_size();
    m.gathered_parameters_peak = partitioned_->peak_live_numel() * element;
    m.gathered_parameters = partitioned_->live_numel() * element;
    m.gathered_pool = partitioned_->pooled_bytes();
  }
  m.buckets = reductions_.staging_bytes();
  return m;
}

}  // namespace tessera
