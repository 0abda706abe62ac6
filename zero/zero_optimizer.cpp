#include "zero/zero_optimizer.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>

#include "parallel/parallel_context.h"

namespace tessera {

// One parameter group: its layout and buffers (see zero/flat_layout.h for the byte layout).
struct ZeroOptimizer::Group {
  FlatLayout layout;
  std::vector<at::Tensor> params;  // the model's tensors, now views into `compute`
  std::vector<std::string> names;  // for error messages
  at::Tensor compute;              // flat, compute dtype: what the model reads
  at::Tensor master;               // fp32 local shard (mixed precision only)
  at::Tensor grads;                // fp32: full flat (stages 0–1) or the local shard (stage 2)
  std::vector<at::Tensor> staging; // stage 2: a bucket's gradients while it fills
  std::vector<int> pending;        // per bucket: parameters whose gradient has not arrived yet
  std::vector<bool> arrived;       // per parameter: its gradient arrived this micro-step
  std::vector<ShardSegment> segments;  // this rank's chunks as views: built once, buffers never move
  std::unique_ptr<FlatOptimizer> optimizer;
  double lr_scale = 1;
  double weight_decay = 0;
  bool mixed() const { return master.defined(); }
};

namespace {

// Autograd calls this right after a parameter's gradient has been accumulated into `.grad`.
class GradReadyHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  GradReadyHook(ZeroOptimizer* owner, int group, int param) : owner_(owner), group_(group), param_(param) {}
  const ZeroOptimizer* owner() const { return owner_; }
  void operator()(const torch::autograd::Variable& tensor) override {
    owner_->on_grad_ready(group_, param_, tensor.grad());
    tensor.mutable_grad().reset();  // folded into the engine's buffers: release autograd's copy
  }

 private:
  ZeroOptimizer* owner_;
  int group_, param_;
};

at::ScalarType compute_dtype_of(const Config& c) {
  if (c.bf16.enabled) return at::kBFloat16;
  if (c.fp16.enabled) return at::kHalf;
  return at::kFloat;
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(const Config& config, ParallelContext& parallel, ModelDescription& model)
    : stage_(config.zero_optimization.stage),
      bucket_numel_(config.zero_optimization.reduce_bucket_size),
      allgather_numel_(config.zero_optimization.allgather_bucket_size),
      data_(parallel.data()),
      compute_dtype_(compute_dtype_of(config)),
      ignore_unused_parameters_(config.zero_optimization.ignore_unused_parameters) {
  if (!config.optimizer)
    throw std::invalid_argument("tessera: the config has no \"optimizer\" section; the engine needs one "
                                "(client-side optimizers are not supported)");
  if (stage_ > 2)
    throw std::invalid_argument("tessera: zero_optimization.stage 3 is not implemented yet (stages 0, 1, 2 are)");
  if (config.zero_optimization.offload_optimizer.device != "none")
    throw std::invalid_argument("tessera: zero_optimization.offload_optimizer is not implemented yet");
  const int dp = data_.size();
  const int partitions = stage_ == 0 ? 1 : dp;
  const int rank = stage_ == 0 ? 0 : data_.rank();
  const double base_lr = config.optimizer->params.lr;
  std::set<const void*> seen;

  for (size_t gi = 0; gi < model.groups.size(); ++gi) {
    auto& spec = model.groups[gi];
    auto g = std::make_unique<Group>();
    std::vector<int64_t> numels;
    for (size_t i = 0; i < spec.params.size(); ++i) {
      const auto& p = spec.params[i];
      g->names.push_back(i < spec.param_names.size() && !spec.param_names[i].empty()
                             ? spec.param_names[i]
                             : "group '" + spec.name + "' parameter " + std::to_string(i));
      if (!p.defined() || !p.requires_grad() || !p.is_leaf())
        throw std::invalid_argument("tessera: " + g->names.back() + " must be a defined leaf tensor that requires grad");
      if (p.device() != data_.device())
        throw std::invalid_argument("tessera: " + g->names.back() + " is on " + p.device().str() +
                                    ", but the data-parallel group's collectives run on " + data_.device().str() +
                                    " (move the model there before initializing the engine)");
      if (!seen.insert(p.unsafeGetTensorImpl()).second)
        throw std::invalid_argument("tessera: a parameter appears twice in the model description (" +
                                    g->names.back() + ")");
      numels.push_back(p.numel());
    }
    if (numels.empty()) continue;
    g->layout = FlatLayout::build(numels, partitions, bucket_numel_);
    const auto& L = g->layout;
    const auto f32 = data_.options(at::kFloat);
    g->compute = at::empty({L.total}, f32.dtype(compute_dtype_));
    if (compute_dtype_ != at::kFloat) g->master = at::empty({L.shard_numel}, f32);
    fill_from_model(*g, spec, rank);

    // The model's tensors become views into the compute buffer (same objects, new storage).
    for (size_t i = 0; i < spec.params.size(); ++i) {
      auto& p = spec.params[i];
      p.set_data(g->compute.narrow(0, L.params[i].offset, L.params[i].numel).view(p.sizes()));
      torch::autograd::impl::set_post_acc_grad_hooks(
          p, std::make_unique<GradReadyHook>(this, static_cast<int>(groups_.size()), static_cast<int>(i)));
      g->params.push_back(p);
    }
    g->grads = at::zeros({stage_ == 2 ? L.shard_numel : L.total}, f32);
    g->segments = make_segments(*g);
    g->staging.resize(L.buckets.size());
    g->pending.resize(L.buckets.size());
    g->arrived.assign(L.params.size(), false);
    for (size_t b = 0; b < L.buckets.size(); ++b) {
      g->pending[b] = static_cast<int>(L.buckets[b].params.size());
      launch_order_.emplace_back(static_cast<int>(groups_.size()), static_cast<int>(b));
    }

    LambContext lamb;
    lamb.pieces = L.pieces(rank);
    lamb.num_params = static_cast<int>(L.params.size());
    if (partitions > 1) lamb.sum_across_ranks = [this](at::Tensor& t) { data_.all_reduce(t); };
    g->optimizer = make_flat_optimizer(*config.optimizer, L.shard_numel, f32, std::move(lamb));
    g->lr_scale = spec.lr ? *spec.lr / base_lr : 1.0;
    g->weight_decay = spec.weight_decay.value_or(config.optimizer->params.weight_decay);
    groups_.push_back(std::move(g));
  }
  if (groups_.empty()) throw std::invalid_argument("tessera: the model description has no parameters");
}

// Fills the compute buffer and the fp32 master shard from the model's tensors AS DATA-PARALLEL
// RANK 0 HOLDS THEM, as DDP and DeepSpeed do at construction: ranks that initialized their model
// differently (another seed) start from identical parameters. The values travel in fp32 (the
// master shard is exact, not rounded through the compute dtype), one broadcast per piece of at
// most 2^24 elements of each bucket: no per-parameter collectives, and a transient of at most
// 64 MiB on top of the model's tensors, the compute buffer and the master shard.
void ZeroOptimizer::fill_from_model(Group& g, const ParamGroup& spec, int rank) {
  constexpr int64_t kPiece = int64_t(1) << 24;
  const FlatLayout& L = g.layout;
  const bool broadcast = data_.size() > 1;
  for (const FlatBucket& k : L.buckets) {
    for (int64_t begin = 0; begin < k.numel; begin += kPiece) {
      const int64_t end = std::min(k.numel, begin + kPiece);  // [begin, end) of the bucket
      at::Tensor values = at::zeros({end - begin}, data_.options(at::kFloat));  // padding stays 0
      for (int p : k.params) {
        const int64_t p_begin = L.params[p].offset - k.offset, p_end = p_begin + L.params[p].numel;
        const int64_t lo = std::max(begin, p_begin), hi = std::min(end, p_end);
        if (lo >= hi) continue;
        values.narrow(0, lo - begin, hi - lo)
            .copy_(spec.params[p].detach().reshape({-1}).narrow(0, lo - p_begin, hi - lo));
      }
      if (broadcast) data_.broadcast(values, 0);
      g.compute.narrow(0, k.offset + begin, end - begin).copy_(values);
      if (!g.mixed()) continue;
      // This rank's chunk of the bucket is [rank·shard, (rank+1)·shard): its part inside this piece.
      const int64_t lo = std::max(begin, rank * k.shard), hi = std::min(end, (rank + 1) * k.shard);
      if (lo < hi) g.master.narrow(0, k.shard_offset + lo - rank * k.shard, hi - lo).copy_(values.narrow(0, lo - begin, hi - lo));
    }
  }
}

ZeroOptimizer::~ZeroOptimizer() {
  // Reductions still in flight here were launched by a backward that threw or a step that failed:
  // waiting could block for the timeout per collective, and their results are not wanted. The
  // c10d work objects keep their tensors alive until the backend is done with them.
  in_flight_.clear();
  // The hooks point at this object: take them off the parameters, which may outlive the engine.
  for (auto& g : groups_)
    for (auto& p : g->params) {
      auto& hook = torch::autograd::impl::post_acc_grad_hooks(p);
      auto* ours = dynamic_cast<GradReadyHook*>(hook.get());
      if (ours && ours->owner() == this) hook.reset();
    }
}

void ZeroOptimizer::begin_backward(bool boundary) { boundary_ = boundary; }

void ZeroOptimizer::on_grad_ready(int group, int param, const at::Tensor& grad) {
  Group& g = *groups_[group];
  const FlatParam& fp = g.layout.params[param];
  const FlatBucket& b = g.layout.buckets[fp.bucket];
  at::Tensor flat = grad.reshape({-1});
  if (stage_ < 2) {
    g.grads.narrow(0, fp.offset, fp.numel).add_(flat);
  } else {
    if (!g.staging[fp.bucket].defined()) g.staging[fp.bucket] = acquire_staging(b.numel);
    g.staging[fp.bucket].narrow(0, fp.offset - b.offset, fp.numel).add_(flat);
  }
  g.arrived[param] = true;
  if (--g.pending[fp.bucket] == 0 && communicates()) launch_ready_buckets();
}

void ZeroOptimizer::launch_ready_buckets() {
  while (next_launch_ < launch_order_.size()) {
    auto [group, bucket] = launch_order_[next_launch_];
    if (groups_[group]->pending[bucket] != 0) return;  // a bucket before the rest is not complete yet
    ++next_launch_;
    launch_bucket(*groups_[group], bucket);
  }
}

void ZeroOptimizer::launch_bucket(Group& g, int bucket) {
  const FlatBucket& b = g.layout.buckets[bucket];
  const int dp = data_.size();
  if (stage_ == 0) {
    if (dp == 1) return;
    at::Tensor view = g.grads.narrow(0, b.offset, b.numel);
    in_flight_.push_back({data_.all_reduce_async(view, ReduceOp::Avg), {}});
    return;
  }
  const int64_t own = g.layout.flat_of_local(data_.rank(), bucket);
  if (stage_ == 1) {
    if (dp == 1) return;
    at::Tensor out = receive_buffer(b.shard);
    at::Tensor mine = g.grads.narrow(0, own, b.shard);
    in_flight_.push_back({data_.reduce_scatter_async(g.grads.narrow(0, b.offset, b.numel), out, ReduceOp::Avg),
                          [this, mine, out]() mutable {
                            mine.copy_(out);
                            receive_bytes_now_ -= out.nbytes();
                          }});
    return;
  }
  // Stage 2: reduce-scatter the staging buffer, add this rank's chunk into its gradient shard.
  if (!g.staging[bucket].defined()) g.staging[bucket] = acquire_staging(b.numel);  // no gradient arrived
  at::Tensor staging = g.staging[bucket];
  g.staging[bucket] = at::Tensor();
  at::Tensor shard = g.grads.narrow(0, b.shard_offset, b.shard);
  auto release = [this, staging]() { release_staging(staging); };
  if (dp == 1) {
    shard.add_(staging);
    release();
    return;
  }
  at::Tensor out = receive_buffer(b.shard);
  in_flight_.push_back({data_.reduce_scatter_async(staging, out, ReduceOp::Avg),
                        [this, shard, out, release]() mutable {
                          shard.add_(out);
                          receive_bytes_now_ -= out.nbytes();
                          release();
                        }});
}

at::Tensor ZeroOptimizer::receive_buffer(int64_t numel) {
  at::Tensor out = at::empty({numel}, at::TensorOptions().dtype(at::kFloat).device(groups_.front()->grads.device()));
  receive_bytes_now_ += out.nbytes();  // every receive buffer in flight counts, until its bucket is folded in
  receive_bytes_peak_ = std::max(receive_bytes_peak_, receive_bytes_now_);
  return out;
}

void ZeroOptimizer::release_staging(const at::Tensor& staging) {
  // acquire_staging hands out a narrowed view: the whole buffer goes back to the free list.
  staging_free_.push_back(staging._base().defined() ? at::Tensor(staging._base()) : staging);
}

at::Tensor ZeroOptimizer::acquire_staging(int64_t numel) {
  // Reuse a free staging buffer; while none is free, finish the oldest reduction (bounded memory).
  while (staging_free_.empty() && !in_flight_.empty()) wait_oldest();
  at::Tensor base;
  for (size_t i = 0; i < staging_free_.size(); ++i) {
    if (staging_free_[i].numel() >= numel) {
      base = staging_free_[i];
      staging_free_.erase(staging_free_.begin() + i);
      break;
    }
  }
  if (!base.defined()) {
    int64_t largest = numel;
    for (const auto& g : groups_)
      for (const auto& b : g->layout.buckets) largest = std::max(largest, b.numel);
    base = at::empty({largest}, at::TensorOptions().dtype(at::kFloat).device(groups_.front()->grads.device()));
    staging_bytes_ += base.nbytes();
  }
  return base.narrow(0, 0, numel).zero_();
}

void ZeroOptimizer::wait_oldest() {
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  f.handle.wait();
  if (f.finish) f.finish();
}

void ZeroOptimizer::wait_all() {
  while (!in_flight_.empty()) wait_oldest();
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
  if (communicates()) {
    while (next_launch_ < launch_order_.size()) {
      auto [group, bucket] = launch_order_[next_launch_++];
      launch_bucket(*groups_[group], bucket);
    }
  }
  reset_bucket_counters();
  wait_all();
}

void ZeroOptimizer::abort_backward() {
  reset_bucket_counters();
  try {
    wait_all();  // the reductions this rank launched (its peers launched them too when all were interrupted)
  } catch (const CommError&) {
    in_flight_.clear();  // a peer did not take part: those results are lost with the rest
  }
  for (auto& g : groups_) {
    for (auto& staging : g->staging) {
      if (staging.defined()) release_staging(staging);
      staging = at::Tensor();
    }
  }
  zero_grad();
}

std::vector<ShardSegment> ZeroOptimizer::make_segments(const Group& g) const {
  const int rank = stage_ == 0 ? 0 : data_.rank();
  std::vector<ShardSegment> out;
  for (size_t b = 0; b < g.layout.buckets.size(); ++b) {
    const FlatBucket& k = g.layout.buckets[b];
    const int64_t flat = g.layout.flat_of_local(rank, b);
    ShardSegment s;
    s.params = g.mixed() ? g.master.narrow(0, k.shard_offset, k.shard) : g.compute.narrow(0, flat, k.shard);
    s.grads = stage_ == 2 ? g.grads.narrow(0, k.shard_offset, k.shard) : g.grads.narrow(0, flat, k.shard);
    s.local_offset = k.shard_offset;
    if (g.mixed()) s.compute_copy = g.compute.narrow(0, flat, k.shard);
    out.push_back(s);
  }
  return out;
}

void ZeroOptimizer::allgather_parameters(Group& g) {
  const int rank = data_.rank();
  std::vector<std::pair<CommHandle, at::Tensor>> pending;  // the handle and its input, kept alive
  int64_t in_flight = 0;
  for (size_t b = 0; b < g.layout.buckets.size(); ++b) {
    const FlatBucket& k = g.layout.buckets[b];
    // The input is this rank's chunk of the output: copy it, as Gloo does not promise in-place.
    at::Tensor chunk = g.compute.narrow(0, g.layout.flat_of_local(rank, b), k.shard).clone();
    at::Tensor whole = g.compute.narrow(0, k.offset, k.numel);
    pending.emplace_back(data_.all_gather_async(chunk, whole), chunk);
    in_flight += k.numel;
    if (in_flight >= allgather_numel_) {  // at most allgather_bucket_size elements in flight
      for (auto& p : pending) p.first.wait();
      pending.clear();
      in_flight = 0;
    }
  }
  for (auto& p : pending) p.first.wait();
}

double ZeroOptimizer::global_grad_sumsq() {
  wait_all();
  // One sum for all groups and ranks, alike on every rank with no extra collective at stage 0:
  // there every rank holds the same averaged gradients (an inf/nan on one rank reached all of them
  // through the allreduce); at stages 1–2 the sum of the shards' squares over the data-parallel
  // group carries an inf/nan from any rank. The squares are summed on the gradients' device; the
  // one host synchronization of the step is reading the total. (The engine runs pure data
  // parallelism today, so the data group is the world; model-parallel groups will add theirs.)
  std::vector<at::Tensor> norms;
  for (auto& g : groups_)
    for (const auto& s : g->segments) norms.push_back(s.grads.norm());
  at::Tensor total = at::stack(norms).to(at::kDouble).square_().sum().reshape({1});
  if (stage_ > 0 && data_.size() > 1) data_.all_reduce(total);
  return total.item<double>();
}

void ZeroOptimizer::apply(double grad_scale, const StepInputs& inputs) {
  for (auto& gp : groups_) {
    Group& g = *gp;
    StepInputs in = inputs;
    in.lr = inputs.lr * g.lr_scale;
    in.weight_decay = g.weight_decay;
    in.grad_scale = grad_scale;
    g.optimizer->step(in, g.segments);  // also writes the compute copy of this rank's chunks
    if (stage_ > 0 && data_.size() > 1) allgather_parameters(g);
  }
}

void ZeroOptimizer::zero_grad() {
  for (auto& g : groups_) g->grads.zero_();
}

MemoryReport ZeroOptimizer::memory() const {
  MemoryReport m;
  for (const auto& g : groups_) {
    m.parameters += g->compute.nbytes();
    if (g->mixed()) m.master_parameters += g->master.nbytes();
    m.gradients += g->grads.nbytes();
    m.optimizer_states += g->optimizer->state_bytes();
  }
  m.buckets = staging_bytes_ + receive_bytes_peak_;
  return m;
}

}  // namespace tessera
