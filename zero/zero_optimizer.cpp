// ZeroOptimizer after construction (zero/zero_optimizer_build.cpp): the optimizer step on the
// shards, the parameter allgathers around it and their waits, the values written back to the
// model, state for checkpoints, and the memory report. The backward side (gradient hooks, bucket
// reductions) is zero/zero_optimizer_backward.cpp; where the shards live (host copies, NVMe files)
// zero/residence.h's strategies.
#include "zero/zero_optimizer.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <stdexcept>

#include "parallel/parallel_context.h"
#include "zero/units.h"

namespace tessera {

ZeroOptimizer::~ZeroOptimizer() {
  if (units_) units_->remove_listener(this);
  if (delayed_.valid()) {  // the last delayed step: its values reach the parameters below
    try {
      finish_delayed_step();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[tessera] the delayed optimizer step failed: %s\n", e.what());
    }
  }
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

std::vector<StepInputs> ZeroOptimizer::group_inputs(double grad_scale, const StepInputs& inputs) const {
  std::vector<StepInputs> in(groups_.size(), inputs);
  for (auto& g : groups_) {
    in[g->index].lr = group_lrs_.empty() ? inputs.lr * g->lr_scale : group_lrs_[g->source_group];
    in[g->index].weight_decay = g->weight_decay;
    in[g->index].grad_scale = grad_scale;
  }
  return in;
}

void ZeroOptimizer::speculate_step(double grad_scale, const StepInputs& inputs) {
  if (speculation_) speculation_->begin(group_inputs(grad_scale, inputs), boundary_);
}

SpeculativeStep::Counts ZeroOptimizer::speculation_counts() const {
  return speculation_ ? speculation_->counts() : SpeculativeStep::Counts{};
}

void ZeroOptimizer::apply(double grad_scale, const StepInputs& inputs) {
  finish_delayed_step();  // the step started at the last boundary: its chunks reach the model first
  const std::vector<StepInputs> in = group_inputs(grad_scale, inputs);
  site_->before_step();  // e.g. the gradient chunks' copies to the host, queued during backward, have landed
  if (delayed_update_after_ >= 0 && inputs.step > delayed_update_after_) {
    // DPU: the host steps while the caller goes on to the next forward and backward, whose
    // gradient copies go to the site's other buffer.
    site_->keep_gradients_for_delayed_step();
    delayed_ = std::async(std::launch::async, [this, in] {
      at::NoGradGuard no_grad;
      step_buckets(in, /*finish=*/false);
    });
    return;
  }
  try {
    // super_offload: the chunks stepped during the backward stand when `in` is what they were
    // stepped with; otherwise they are restored and stepped below like the rest.
    const std::vector<std::vector<char>> stepped = speculation_ ? speculation_->settle(in) : std::vector<std::vector<char>>{};
    step_buckets(in, /*finish=*/true, stepped);
  } catch (...) {
    params_->abandon(groups_);
    throw;
  }
  params_->wait_writes();                        // a failed write stops training at this step
  if (partitioned_) partitioned_->after_step();  // the shards are updated: gathered copies are stale
}

void ZeroOptimizer::step_buckets(const std::vector<StepInputs>& in, bool finish,
                                 const std::vector<std::vector<char>>& stepped) {
  // Groups stepped in one call first, then every other bucket in the order the next forward reads
  // them, each bound where its shard lives, stepped (tile by tile when the state is in files) and
  // finished: its allgather runs on the backend's thread while the optimizer updates the next.
  // (The groups stepped whole are all stepped before any is finished: a client optimizer steps
  // once every group has come in, so before that their chunks are not final.) Chunks stepped
  // already (super_offload's, during the backward) are finished first, in the same order.
  BucketOrder buckets;
  for (auto& g : groups_) {
    if (!steps_whole(*g)) continue;
    const auto is_stepped = [&](int b) { return !stepped.empty() && stepped[g->index][b]; };
    std::vector<ShardSegment> rest;  // an elementwise group some of whose chunks were stepped already
    for (size_t b = 0; b < g->segments.size(); ++b)
      if (!is_stepped(static_cast<int>(b))) rest.push_back(site_->segments(*g)[b]);
    if (rest.size() == g->segments.size()) step_group(*g, in[g->index]);
    else if (!rest.empty()) g->optimizer->step(in[g->index], rest);
  }
  for (const auto& [group, bucket] : gather_order_) {
    ZeroGroup& g = *groups_[group];
    const bool done = steps_whole(g) || (!stepped.empty() && stepped[group][bucket]);
    if (!done) buckets.emplace_back(group, bucket);
    else if (finish) finish_bucket(g, bucket);
  }
  state_->step(
      buckets,
      [&](int group, int bucket) {
        params_->bind(*groups_[group], bucket);
        site_->follow_shard(*groups_[group], bucket);
        return site_->segments(*groups_[group])[bucket];
      },
      [&](int group, const ShardSegment& piece, const std::vector<at::Tensor>& state) {
        if (state.empty()) groups_[group]->optimizer->step(in[group], {piece});
        else groups_[group]->optimizer->step_with_state(in[group], {piece}, state, piece.local_offset);
      },
      [&](int group, int bucket) {
        if (finish) finish_bucket(*groups_[group], bucket);
      });
}

void ZeroOptimizer::finish_delayed_step() {
  if (!delayed_.valid()) return;
  delayed_.get();  // rethrows what the step threw
  for (const auto& [group, bucket] : gather_order_) finish_bucket(*groups_[group], bucket);
  if (partitioned_) partitioned_->after_step();  // ZeRO-3: the shards took the update; gathered copies are stale
}

bool ZeroOptimizer::steps_whole(const ZeroGroup& g) const {
  if (state_->in_files()) return false;  // the state streams tile by tile (elementwise optimizers only)
  return !g.optimizer->elementwise() || (!stage_->gathers(g) && !params_->in_files(g));
}

void ZeroOptimizer::step_group(ZeroGroup& g, const StepInputs& in) {
  // LAMB's trust ratios need whole parameters: with the shard in files, it comes into memory for the step.
  params_->with_group_resident(g, [&] {
    site_->follow_shard(g, -1);
    g.optimizer->step(in, site_->segments(g));
  });
  site_->follow_shard(g, -1);  // back in its file: the host views let go of the memory
}

void ZeroOptimizer::finish_bucket(ZeroGroup& g, int bucket) {
  params_->unbind(g, bucket);
  site_->follow_shard(g, bucket);  // a chunk written back to its file: the host view lets go
  site_->after_bucket(g, bucket);  // before its allgather reads it
  if (stage_->gathers(g) && !g.partitioned) launch_gather(g, bucket);  // stage 3's are gathered around their units
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
  if (!(overlap_allgather_ && model_reports_units && units_)) wait_for_gathers();
}

void ZeroOptimizer::wait_for_parameters() {
  finish_delayed_step();
  if (speculation_) speculation_->cancel();  // the master and state as they were before the backward
  wait_for_gathers();
}

void ZeroOptimizer::wait_for_gathers() {
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
      if (g.partitioned) params_->write(g, static_cast<int>(b), mine);
      if (g.mixed()) state_->write_master(g, static_cast<int>(b), mine);
    }
    site_->values_changed(g);
  }
  params_->wait_writes();
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

void ZeroOptimizer::wait_for_host_readers() { site_->wait_for_readers(); }

void ZeroOptimizer::write_checkpoint_state(int group, const std::vector<at::Tensor>& arrays) {
  ResidentParameters resident(*this);  // the compute copy follows a master
  state_->write(*groups_.at(group), arrays);
}

ZeroOptimizer::ResidentParameters::ResidentParameters(ZeroOptimizer& zero, bool modifies)
    : zero_(zero), exceptions_(std::uncaught_exceptions()) {
  zero_.params_->bring_in(zero_.groups_, modifies);
}

ZeroOptimizer::ResidentParameters::~ResidentParameters() noexcept(false) {
  if (std::uncaught_exceptions() == exceptions_) {
    zero_.params_->put_back(zero_.groups_);
    return;
  }
  try {  // unwinding already: a second error must not terminate
    zero_.params_->put_back(zero_.groups_);
  } catch (const std::exception&) {
  }
}

void ZeroOptimizer::after_shards_loaded() {
  wait_for_parameters();
  ResidentParameters resident(*this);
  for (auto& g : groups_) {
    site_->values_changed(*g);  // fp32 training: the loaded values are the device's
    state_->compute_follows_master(*g);
    if (stage_->gathers(*g) && !g->partitioned)
      for (size_t b = 0; b < g->layout.buckets.size(); ++b) launch_gather(*g, static_cast<int>(b));
  }
  wait_for_parameters();
  if (partitioned_) partitioned_->after_step();
  zero_grad();
}

void ZeroOptimizer::zero_grad() {
  if (speculation_) speculation_->cancel();  // a step speculated and not applied (skipped: overflow)
  for (auto& g : groups_) g->grads.zero_();
  window_start_ = true;  // the host copies (gradients on the host) are overwritten, not added to
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
    if (g->compute.defined()) (site_->holds_shard(*g) ? m.host_parameter_bytes : m.parameters) += g->compute.nbytes();
    m.gradients += g->grads.nbytes();
    site_->add_memory(*g, m);  // master, state and the site's own copies
  }
  state_->add_memory(m);
  params_->add_memory(m);
  if (partitioned_ && !groups_.empty()) {
    const int64_t element = groups_.front()->params.front().element_size();
    m.gathered_parameters_peak = partitioned_->peak_live_numel() * element;
    m.gathered_parameters = partitioned_->live_numel() * element;
    m.gathered_pool = partitioned_->pooled_bytes();
  }
  if (speculation_) m.host_optimizer_bytes += speculation_->copy_bytes();
  m.buckets = reductions_.staging_bytes();
  return m;
}

}  // namespace tessera
