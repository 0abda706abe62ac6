// ZeroOptimizer's side of a backward (zero/zero_optimizer.h): each gradient folded into its bucket
// as autograd produces it, complete buckets reduced in the fixed launch order (each one's norm taken
// as its reduction completes on a boundary), and the end or abort of a backward.
#include "zero/zero_optimizer.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "csrc/device_stream.h"
#include "parallel/communicator.h"
#include "zero/units.h"

namespace tessera {

void ZeroOptimizer::begin_backward(bool boundary, int64_t next_step) {
  boundary_ = boundary;
  // The 1-bit family after its warm-up: the gradients stay this rank's own (optim/onebit.h).
  averaging_ = groups_.empty() || groups_.front()->optimizer->wants_averaged_gradients(next_step);
  if (boundary)
    for (GradPart& part : grad_parts_) {
      part.norm = at::Tensor();  // taken again as the buckets complete
      // Local gradients differ between ranks: their squared norms are summed over the data group
      // (each divided by its size, so the norm is the RMS of the ranks' norms), which also makes an
      // overflow on any rank an overflow on all.
      part.data_sharded = averaging_ ? stage_->gradients_data_sharded() : true;
    }
}

void ZeroOptimizer::take_norm(GradPart& part, const at::Tensor& grads) const {
  part.norm = gradient_norm(grads);
  // Local gradients: summed over the data group as data-sharded (begin_backward), each divided by
  // √p, the total is the mean of the ranks' squared norms.
  if (!averaging_) part.norm.div_(std::sqrt(double(part.group ? part.group->size() : data_.size())));
}

void ZeroOptimizer::gradient_final(size_t i) {
  take_norm(grad_parts_[i], grad_parts_[i].grads);
  const auto [group, bucket] = launch_order_[i];
  site_->gradient_final(*groups_[group], bucket);  // e.g. its host copy, queued behind the reduction
}

bool ZeroOptimizer::reduces_now() const {
  return averaging_ && (boundary_ || stage_->reduces_every_micro_step());
}

void ZeroOptimizer::on_grad_ready(int group, int param, const at::Tensor& grad) {
  ZeroGroup& g = *groups_[group];
  stage_->accumulate(g, param, grad.reshape({-1}), reductions_);
  g.arrived[param] = true;
  const int bucket = g.layout.params[param].bucket;
  if (--g.pending[bucket] == 0 && reduces_now()) launch_ready_buckets();
  if (units_) units_->parameter_gradient(g.unit_of[param]);
}

void ZeroOptimizer::launch_ready_buckets() {
  while (next_launch_ < launch_order_.size()) {
    auto [group, bucket] = launch_order_[next_launch_];
    if (groups_[group]->pending[bucket] != 0) return;  // a bucket before the rest is not complete yet
    reduce(next_launch_++);
  }
}

void ZeroOptimizer::reduce(size_t launch_index) {
  auto [group, bucket] = launch_order_[launch_index];
  std::function<void()> done;
  // The last reduction before the step: the bucket's norm now, while its chunk is fresh in cache
  // and the next bucket's reduction is in flight.
  const bool norm_here = boundary_ && !gradients_to_host_;  // (on the host path reduced_to_host does this)
  // super_offload: once the chunk (and its copy to the host) is final, the host may step it.
  const bool speculate = speculation_ && speculation_->open();
  if (norm_here || speculate) {
    done = [this, launch_index, group, bucket, norm_here, speculate] {
      ZeroGroup& g = *groups_[group];
      if (norm_here) {
        if (g.gradient_scale != 1.0) stage_->gradient_chunk(g, bucket).mul_(g.gradient_scale);
        gradient_final(launch_index);
      }
      if (speculate) speculation_->submit(group, bucket, DeviceEvent::record(data_.device()));
    };
  }
  stage_->reduce_bucket(*groups_[group], bucket, reductions_, std::move(done));
}

void ZeroOptimizer::reduced_to_host(ZeroGroup& g, int bucket, at::Tensor& reduced) {
  at::Tensor host = site_->host_gradient(g, bucket);
  // The window's sum so far comes back to be added on the device (queued on the same stream as
  // the copy that took it there), so the host never waits for a micro-step's chunk.
  if (!window_start_) reduced.add_(host.to(reduced.device(), /*non_blocking=*/true));
  if (boundary_) {
    if (g.gradient_scale != 1.0) reduced.mul_(g.gradient_scale);
    take_norm(grad_parts_[launch_index_[g.index][bucket]], reduced);
  }
  host.copy_(reduced, /*non_blocking=*/true);
}

void ZeroOptimizer::sum_group_gradients(int group, Communicator& across, bool counted_here) {
  if (gradients_to_host_)
    throw std::invalid_argument("tessera: weights tied across pipeline stages with the optimizer offloaded at ZeRO "
                                "stage 2-3 (the gradients live on the host): not supported yet; use stage 1");
  reductions_.wait_all();
  if (speculation_) speculation_->cancel();  // the chunks stepped so far had the gradients before these sums
  std::vector<CommHandle> sums;
  for (size_t i = 0; i < launch_order_.size(); ++i) {
    if (groups_[launch_order_[i].first]->source_group != group) continue;  // the model's group, maybe split in two
    GradPart& part = grad_parts_[i];
    sums.push_back(across.all_reduce_async(part.grads, ReduceOp::Sum));
    part.counted = counted_here;
  }
  for (CommHandle& h : sums) h.wait();
  for (size_t i = 0; i < launch_order_.size(); ++i)  // the sums' norms, taken again
    if (groups_[launch_order_[i].first]->source_group == group) gradient_final(i);
}

std::string ZeroOptimizer::unused_parameters() const {
  std::string names;
  int count = 0;
  for (const auto& g : groups_)
    for (size_t i = 0; i < g->arrived.size(); ++i)
      if (!g->arrived[i] && ++count <= 20) names += (names.empty() ? "" : ", ") + g->names[i];
  if (count > 20) names += ", ... (" + std::to_string(count) + " in all)";
  return names;
}

void ZeroOptimizer::reset_bucket_counters() {
  for (auto& g : groups_) {
    for (size_t b = 0; b < g->layout.buckets.size(); ++b)
      g->pending[b] = static_cast<int>(g->layout.buckets[b].params.size());
    std::fill(g->arrived.begin(), g->arrived.end(), false);
  }
  next_launch_ = 0;
}

void ZeroOptimizer::end_backward() {
  if (!ignore_unused_parameters_) {
    std::string unused = unused_parameters();
    if (!unused.empty()) {
      abort_backward();
      throw std::runtime_error(
          "tessera: these parameters received no gradient in this backward: " + unused +
          ". Every rank must reduce every bucket, so with zero_optimization.ignore_unused_parameters false "
          "an unused parameter is an error; set it to true (DeepSpeed's default) to treat missing "
          "gradients as zero, or make the forward use them.");
    }
  }
  // Whatever has not been launched yet goes now, in the fixed order; missing gradients are zero.
  if (reduces_now()) {
    while (next_launch_ < launch_order_.size()) reduce(next_launch_++);
  } else if (boundary_) {  // gradients kept local (optim/onebit.h): their norms here
    for (size_t i = 0; i < grad_parts_.size(); ++i) gradient_final(i);
  }
  reset_bucket_counters();
  if (units_) units_->end_backward();
  reductions_.wait_all();
  reductions_.free_staging();
  window_start_ = false;  // the host copies hold this micro-step's chunks: the next one adds to them
}

void ZeroOptimizer::abort_backward() {
  reset_bucket_counters();
  if (partitioned_) partitioned_->abort_backward();
  if (units_) units_->abort_backward();
  try {
    reductions_.wait_all();  // the reductions this rank launched (its peers launched them too when all were interrupted)
  } catch (const CommError&) {
    reductions_.drop();  // a peer did not take part: those results are lost with the rest
  }
  for (auto& g : groups_) {
    for (auto& staging : g->staging) {
      if (staging.defined()) reductions_.release_staging(g->index, staging);
      staging = at::Tensor();
    }
  }
  zero_grad();
}

}  // namespace tessera
