// ZeroOptimizer's construction: the engine's groups out of the model's (split by tensor sharding
// and, at ZeRO-3, by partitioning), every buffer planned from their sizes (zero/buffer_plan.h) and
// allocated, the model's tensors re-pointed into them, the values filled in as data-parallel rank 0
// holds them, each group's optimizer, offload, and the orders of gathers and reductions. Also the
// gradient hooks it installs and removes.
#include "zero/zero_optimizer.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <stdexcept>
#include <unordered_map>

#include "parallel/parallel_context.h"
#include "zero/bucket_order.h"
#include "zero/partitioned_init.h"
#include "zero/units.h"

namespace tessera {
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

// The engine's groups: each of the model's groups, split in two when it mixes tensor-sharded and
// replicated parameters (the norm reduces them over different groups, so a bucket holds one kind),
// and at stage 3 again when it mixes partitioned and persistent ones (persistent: fewer elements
// than the threshold, or listed by no unit, so no unit event would gather them).
struct GroupSpec {
  const ParamGroup* source;
  std::vector<int> members;  // indices into source->params
  bool tensor_sharded;
  bool partitioned;
};

std::vector<GroupSpec> split_groups(const ModelDescription& model, const std::function<bool(const at::Tensor&)>& partition) {
  std::vector<GroupSpec> out;
  for (const ParamGroup& g : model.groups)
    for (bool sharded : {false, true})
      for (bool partitioned : {true, false}) {
        GroupSpec s{&g, {}, sharded, partitioned};
        for (size_t i = 0; i < g.params.size(); ++i)
          if ((i < g.tensor_splits.size() && g.tensor_splits[i].sharded()) == sharded &&
              (partition && g.params[i].defined() && partition(g.params[i])) == partitioned)
            s.members.push_back(static_cast<int>(i));
        if (!s.members.empty()) out.push_back(std::move(s));
      }
  return out;
}

// A model group's communicator, by name: the replicas ("data", or "data*context" with context
// parallelism), or the one it names, which must not span the tensor or pipe axes (its parameters'
// copies there are another matter: tensor slices, stages). Context-parallel ranks hold the same
// parameters and see different tokens, so a named group is taken together with the context axis.
std::string group_spec(ParallelContext& parallel, const ParamGroup& group) {
  const bool context = parallel.grid().context > 1;
  if (group.communicator.empty() || group.communicator == "data") return context ? "data*context" : "data";
  for (const char* axis : {"tensor", "pipe"})
    if (parallel.axes().spans(group.communicator, axis))
      throw std::invalid_argument("tessera: parameter group '" + group.name + "' is reduced over '" + group.communicator +
                                  "', which spans the " + axis + " axis: a group's communicator is the data axis, "
                                  "a factor of it, or its product with axes other than tensor and pipe");
  if (context && !parallel.axes().spans(group.communicator, "context")) return group.communicator + "*context";
  return group.communicator;
}

// Checks every parameter (a defined leaf on the collectives' device, named once, its zero.Init
// chunk the right size) and gathers the groups' sizes for the buffer planner; `names` gets each
// group's parameter names.
BufferPlanInput plan_input(const ZeroOptions& options, const std::vector<GroupSpec>& specs,
                           const std::vector<Communicator*>& comms, Communicator& data, UnitTracker* units,
                           std::vector<std::vector<std::string>>& names) {
  std::set<const void*> seen;
  BufferPlanInput input;
  input.stage = options.stage;
  input.data_parallel = data.size();
  for (Communicator* c : comms) input.group_partitions.push_back(c->size());
  input.compute_bytes = static_cast<int>(c10::elementSize(options.compute_dtype));
  input.bucket_numel = options.reduce_bucket_numel;
  input.state_floats = optimizer_state_floats(options.optimizer, options.hyper);
  input.backend_copies_reductions = data.device().is_cpu();  // Gloo
  input.wire_bytes = static_cast<int>(c10::elementSize(options.communication_dtype));
  input.gradient_bytes = static_cast<int>(c10::elementSize(options.gradient_dtype));
  for (size_t gi = 0; gi < specs.size(); ++gi) {
    const ParamGroup& spec = *specs[gi].source;
    std::vector<int64_t> numels;
    std::vector<int> keys;
    for (int i : specs[gi].members) {
      const at::Tensor& p = spec.params[i];
      names[gi].push_back(param_name(spec, i));
      const std::string& name = names[gi].back();
      if (!p.defined() || !p.requires_grad() || !p.is_leaf())
        throw std::invalid_argument("tessera: " + name + " must be a defined leaf tensor that requires grad");
      if (p.device() != data.device())
        throw std::invalid_argument("tessera: " + name + " is on " + p.device().str() +
                                    ", but the data-parallel group's collectives run on " + data.device().str() +
                                    " (move the model there before initializing the engine)");
      if (!seen.insert(p.unsafeGetTensorImpl()).second)
        throw std::invalid_argument("tessera: a parameter appears twice in the model description (" + name + ")");
      const at::Tensor* chunk = static_cast<size_t>(i) < spec.shards.size() && spec.shards[i].defined() ? &spec.shards[i] : nullptr;
      if (chunk && comms[gi] != &data)
        throw std::invalid_argument("tessera: " + name + " was partitioned by zero.Init over the data group, but its "
                                    "parameter group is reduced over '" + spec.communicator + "': build it whole "
                                    "(outside zero.Init) or leave its group on the data group");
      if (chunk && chunk->numel() != init_chunk_numel(p.numel(), data.size()))
        throw std::invalid_argument("tessera: " + name + " was partitioned by zero.Init into chunks of " +
                                    std::to_string(chunk->numel()) + " elements, which is not 1/" +
                                    std::to_string(data.size()) + " of it: zero.Init and the engine must see the "
                                    "same data-parallel degree (the same config)");
      if (!chunk && p.numel() > 1 && static_cast<int64_t>(p.storage().nbytes()) < p.numel() * p.element_size())
        throw std::invalid_argument("tessera: " + name + " holds no values of its own (a released ZeRO-3 parameter "
                                    "of another engine, or one partitioned by zero.Init whose chunks were not handed "
                                    "to this engine: a failed initialize consumes them; build the model again)");
      numels.push_back(p.numel());
      if (specs[gi].partitioned) keys.push_back(units->owner_of(p));
    }
    input.group_numels.push_back(std::move(numels));
    input.group_keys.push_back(std::move(keys));
    input.group_partitioned.push_back(specs[gi].partitioned);
  }
  if (seen.empty()) throw std::invalid_argument("tessera: the model description has no parameters");
  return input;
}

// LAMB's per-parameter norms: the pieces of a parameter on other ranks (the group's communicator),
// and the other slices of a tensor-sharded parameter (`tensor`, null when not); the 1-bit family's
// data group.
OptimizerContext optimizer_context(const ZeroGroup& g, int rank, Communicator* tensor) {
  const FlatLayout& L = g.layout;
  OptimizerContext context;
  context.pieces = L.pieces(rank);
  context.num_params = static_cast<int>(L.params.size());
  Communicator* data_sum = L.partitions > 1 ? g.comm : nullptr;
  Communicator* tensor_sum = tensor;
  if (data_sum || tensor_sum) {
    // A host optimizer's values (LAMB's norms) visit the group's device for the collective.
    auto across = [data_sum, tensor_sum](at::Tensor& t, ReduceOp op) {
      at::Tensor on = t.to((data_sum ? data_sum : tensor_sum)->device());
      if (data_sum) data_sum->all_reduce(on, op);
      if (tensor_sum) tensor_sum->all_reduce(on, op);
      if (!on.is_same(t)) t.copy_(on);
    };
    context.sum_across_ranks = [across](at::Tensor& t) { across(t, ReduceOp::Sum); };
    context.max_across_ranks = [across](at::Tensor& t) { across(t, ReduceOp::Max); };
  }
  context.data = g.comm;
  return context;
}

// A model built under PartitionedInit: its parameters hold no bytes, their values are chunks, taken
// out of the description here (by parameter) and freed bucket by bucket as the buffers are filled.
std::unordered_map<const void*, at::Tensor> take_init_chunks(ModelDescription& model) {
  std::unordered_map<const void*, at::Tensor> chunks;
  for (ParamGroup& g : model.groups) {
    for (size_t i = 0; i < g.shards.size() && i < g.params.size(); ++i)
      if (g.shards[i].defined()) chunks[g.params[i].unsafeGetTensorImpl()] = std::move(g.shards[i]);
    g.shards.clear();
  }
  return chunks;
}

}  // namespace

GradPart ZeroOptimizer::gradient_part(const ZeroGroup& g, const at::Tensor& grads) const {
  GradPart part{grads, stage_->gradients_data_sharded(), g.tensor_sharded, {}};
  if (g.comm != &data_) part.group = g.comm;
  return part;
}

int64_t optimizer_state_floats(const std::string& optimizer, const OptimizerHyperparams& hyper) {
  if (optimizer == "SGD") return hyper.momentum != 0 ? 1 : 0;
  // The 1-bit family: + the worker error (the server's N/p left out); 0/1 Adam + the local steps'
  // sum, 1-bit LAMB + the fresh variance (optim/onebit.h).
  if (optimizer == "OneBitAdam") return 3;
  if (optimizer == "ZeroOneAdam" || optimizer == "OneBitLamb") return 4;
  return 2;  // Adam, AdamW, Lamb: m and v
}

ZeroOptimizer::ZeroOptimizer(const ZeroOptions& options, ParallelContext& parallel, ModelDescription& model,
                             UnitTracker* units)
    : stage_(make_zero_stage(options.stage, options.communication_dtype, options.reduce_scatter)),
      overlap_allgather_(options.overlap_allgather),
      data_(parallel.replicas()),
      reductions_(parallel.replicas().device()),
      units_(units),
      ignore_unused_parameters_(options.ignore_unused_parameters) {
  stage_->set_predivide_factor(options.predivide_factor);
  // Check the tensors, then plan every buffer from their sizes alone.
  std::function<bool(const at::Tensor&)> partition;
  if (options.stage == 3)
    partition = [&](const at::Tensor& p) { return p.numel() >= options.persistence_threshold && units && units->owner_of(p) >= 0; };
  const std::vector<GroupSpec> specs = split_groups(model, partition);
  // Each group's communicator (ParamGroup::communicator), made here by every rank in the same order.
  std::vector<Communicator*> comms;
  std::vector<std::string> comm_names;
  for (const GroupSpec& spec : specs) {
    comm_names.push_back(group_spec(parallel, *spec.source));
    comms.push_back(&parallel.group_over(comm_names.back()));
  }
  std::vector<std::vector<std::string>> names(specs.size());
  plan_ = plan_buffers(plan_input(options, specs, comms, data_, units, names));
  std::unordered_map<const void*, at::Tensor> chunks = take_init_chunks(model);
  if (!chunks.empty() && options.stage == 3 && !units)
    throw std::invalid_argument("tessera: a model built under zero.Init needs its units reported (zero/model.h)");
  // Stage 3 of a model that enters its units (ModelDescription::enters_units; the Python binding's
  // hooks) or was built partitioned: every bucket's gathered buffer goes once it is filled, so a
  // model built whole is never held twice (its tensors and the buffers, then beside the gradients
  // and optimizer state) and starts released; the first forward gathers what it uses. Any other
  // model stays whole until it reports a unit.
  const bool start_released = options.stage == 3 && units && (model.enters_units || !chunks.empty());
  std::vector<int64_t> pools;
  for (const GroupBuffers& g : plan_.groups) pools.push_back(g.largest_bucket);
  reductions_.set_staging_pools(std::move(pools));
  choose_residence(options);
  // The host step at stages 2–3 takes each reduced chunk to the host as it completes (the device
  // keeps no gradient shard, as DeepSpeed's CPU offload); a client optimizer steps the device's
  // segments' views, so it keeps them.
  gradients_to_host_ = site_->on_host() && options.stage >= 2 && !model.client_optimizer;
  if (gradients_to_host_)
    stage_->send_reduced_chunks([this](ZeroGroup& g, int bucket, at::Tensor& reduced) { reduced_to_host(g, bucket, reduced); });

  try {  // a refusal (a client optimizer with NVMe, a bad path) must leave no hook pointing at this object
    for (size_t gi = 0; gi < specs.size(); ++gi) {
      const GroupSpec& spec = specs[gi];
      groups_.push_back(std::make_unique<ZeroGroup>());
      ZeroGroup& g = *groups_.back();
      g.index = static_cast<int>(gi);
      g.names = std::move(names[gi]);
      g.tensor_sharded = spec.tensor_sharded;
      for (int i : spec.members)
        g.tensor_splits.push_back(i < static_cast<int>(spec.source->tensor_splits.size()) ? spec.source->tensor_splits[i]
                                                                                        : TensorSplit{});
      g.source_group = static_cast<int>(spec.source - model.groups.data());
      g.comm = comms[gi];
      g.comm_name = comm_names[gi];
      g.lr_scale = spec.source->lr ? *spec.source->lr / options.hyper.lr : 1.0;
      g.gradient_scale = spec.source->gradient_scale;
      if (g.gradient_scale != 1.0 && is_onebit_optimizer(options.optimizer))
        throw std::invalid_argument("tessera: " + options.optimizer + " steps each rank's own gradient after its "
                                    "warm-up, which group '" + spec.source->name + "' (an MoE layer's experts, "
                                    "gradient scale " + std::to_string(g.gradient_scale) + ") cannot be: use Adam "
                                    "or AdamW with MoE layers");
      g.weight_decay = spec.source->weight_decay.value_or(options.hyper.weight_decay);
      allocate_group(g, plan_.groups[gi], options, parallel);
      const int rank = stage_->shard_rank(g);
      std::vector<at::Tensor> params, shards;
      for (int i : spec.members) {
        params.push_back(spec.source->params[i]);
        auto chunk = chunks.find(params.back().unsafeGetTensorImpl());
        shards.push_back(chunk != chunks.end() ? std::move(chunk->second) : at::Tensor());
        if (chunk != chunks.end()) chunks.erase(chunk);
      }
      adopt_parameters(g, params, shards, rank, start_released);
      add_segments(g, plan_.groups[gi].grad_numel, options.gradient_dtype, rank);
      site_->add_group(g, options.gradient_dtype, options.compute_dtype);  // its own copies (HostStep)
      make_optimizer(g, options, model.client_optimizer, rank,
                     spec.tensor_sharded && parallel.tensor().size() > 1 ? &parallel.tensor() : nullptr);
    }
    state_->attach(groups_, *site_);  // NVMe: the state and master to their files
    params_->attach(groups_);         // NVMe: the partitioned shards to theirs
    for (const auto& g : groups_) site_->follow_shard(*g, -1);  // HostStep lets go of the shards' memory
    for (const auto& g : groups_) g->check();
  } catch (...) {
    // The model's partitioned tensors were re-pointed at buffers that are gone: they read as NaN,
    // as released parameters do, rather than as storage without bytes (a failed initialize consumes
    // the model, as one built under zero.Init; build it again).
    if (start_released)
      for (const auto& g : groups_)
        if (g->partitioned)
          for (at::Tensor& p : g->params)
            if (p.defined()) p.set_data(at::full({1}, NAN, p.options().requires_grad(false)).expand(p.sizes()));
    remove_grad_hooks();
    throw;
  }
  gathering_.resize(groups_.size());
  for (size_t gi = 0; gi < groups_.size(); ++gi) gathering_[gi].assign(groups_[gi]->layout.buckets.size(), 0);
  if (units_) {
    unit_buckets_ = buckets_by_unit(groups_, *units_);
    units_->add_listener(this);
  }
  gather_order_ = forward_order(groups_, unit_buckets_);
  launch_order_ = reduction_order(groups_, /*by_unit=*/options.stage == 3);
  launch_index_.resize(groups_.size());
  for (size_t gi = 0; gi < groups_.size(); ++gi) launch_index_[gi].resize(groups_[gi]->layout.buckets.size());
  // With the gradients on the host the norm is taken from the reduced chunk as it passes
  // (reduced_to_host); the parts hold nothing of their own.
  const at::Tensor none = gradients_to_host_ ? at::empty({0}, data_.options(at::kFloat)) : at::Tensor();
  for (size_t i = 0; i < launch_order_.size(); ++i) {
    const auto [gi, b] = launch_order_[i];
    launch_index_[gi][b] = i;
    grad_parts_.push_back(gradient_part(*groups_[gi], gradients_to_host_ ? none : groups_[gi]->segments[b].grads));
  }
  for (auto& g : groups_)
    if (delayed_update_after_ >= 0 && !g->optimizer->elementwise())
      throw std::invalid_argument("tessera: a delayed parameter update steps bucket by bucket on a thread of its own: "
                                  "it needs an elementwise optimizer (Adam, AdamW, SGD)");
  if (options.speculative_step) make_speculation(options);
  if (options.stage == 3) {
    std::vector<ZeroGroup*> all;
    for (auto& g : groups_) all.push_back(g.get());
    if (units_)
      partitioned_ = std::make_unique<PartitionedParameters>(parallel.data_parameters(), all, *units_, options.partitioned,
                                                             start_released, params_->swapper());
  }
}

// Where the shards live (zero/residence.h). The host step is the GPU ranks' (or, with
// host_staging_on_cpu, a CPU rank's test of it); with it ZeRO-3's shards offloaded to host memory
// or to NVMe files are stepped where they are, in host memory.
void ZeroOptimizer::choose_residence(const ZeroOptions& options) {
  const bool host_step = options.host_optimizer && (!data_.device().is_cpu() || options.host_staging_on_cpu);
  const bool shards_in_files = options.nvme_parameters && options.stage == 3;
  site_ = host_step ? make_host_step(data_.device(), options.host_pinned,
                                     /*shards_on_host=*/(options.host_parameters || shards_in_files) && options.stage == 3)
                    : make_in_place_step();
  state_ = options.nvme_optimizer ? make_state_in_files(*options.nvme_optimizer) : make_state_in_memory();
  params_ = shards_in_files ? make_parameters_in_files(*options.nvme_parameters, /*buffers_on_host=*/host_step)
                            : make_parameters_in_memory();
  // A delayed step writes host copies the model does not read until it is finished: the host step
  // at stages 1-3, its state in memory or streamed from its files, but not ZeRO-3's shards in host
  // memory (the update would write what the forward gathers; engine/runnable.cpp names the keys).
  delayed_update_after_ = options.delayed_update_after;
  if (delayed_update_after_ >= 0 && (!host_step || options.stage == 0 || (options.stage == 3 && options.host_parameters)))
    throw std::invalid_argument("tessera: a delayed parameter update needs the optimizer's host step at ZeRO stage 1-3, "
                                "without the ZeRO-3 shards in host memory");
}

// The group's parameter buffers: the compute copy (whole, or its shard at stage 3) and the fp32
// master shard with mixed precision; stage 3's gathered buffers are made per bucket.
void ZeroOptimizer::allocate_group(ZeroGroup& g, const GroupBuffers& planned, const ZeroOptions& options,
                                   ParallelContext& parallel) {
  const auto f32 = data_.options(at::kFloat);
  g.layout = planned.layout;
  g.partitioned = planned.partitioned;
  if (g.partitioned) g.gather_comm = &parallel.group_over(g.comm_name, "parameters");
  g.mixed_precision = options.compute_dtype != at::kFloat;
  // With offload_param cpu on GPU ranks a partitioned group's shard is host memory, the host step's copy.
  g.compute = at::empty({planned.compute_numel}, site_->shard_options(f32, g.partitioned).dtype(options.compute_dtype));
  if (g.partitioned) g.gathered.resize(g.layout.buckets.size());
  if (planned.master_numel) g.master = at::empty({planned.master_numel}, site_->master_options(f32));
}

// Bucket by bucket: the buffers filled from the model's tensors (or zero.Init's `shards`) as rank 0
// holds them, then the tensors re-pointed into them (same objects, new storage: the compute
// buffer, or at stage 3 their bucket's gathered buffer, freed at once when `release_gathered`),
// each with the hook that reports its gradient. The old storage and the chunks go as each bucket is done.
void ZeroOptimizer::adopt_parameters(ZeroGroup& g, const std::vector<at::Tensor>& params,
                                     std::vector<at::Tensor>& shards, int rank, bool release_gathered) {
  const FlatLayout& L = g.layout;
  g.params.resize(params.size());
  g.unit_of.assign(params.size(), -1);
  for (size_t b = 0; b < L.buckets.size(); ++b) {
    const FlatBucket& k = L.buckets[b];
    if (g.partitioned) g.gathered[b] = at::empty({k.numel}, data_.options(g.compute.scalar_type()));
    fill_bucket(g, static_cast<int>(b), params, shards, rank);
    for (int i : k.params) {
      at::Tensor p = params[i];
      const FlatParam& fp = L.params[i];
      at::Tensor flat = g.partitioned ? g.gathered[b].narrow(0, fp.offset - k.offset, fp.numel)
                                      : g.compute.narrow(0, fp.offset, fp.numel);
      p.set_data(flat.view(p.sizes()));
      torch::autograd::impl::set_post_acc_grad_hooks(p, std::make_unique<GradReadyHook>(this, g.index, i));
      g.params[i] = p;
      g.unit_of[i] = units_ ? units_->owner_of(p) : -1;
      shards[i] = at::Tensor();
    }
    if (g.partitioned && release_gathered) release_storage(g.gathered[b]);
  }
}

// The gradient buffer (allocated once the model's own tensors are gone) and this rank's chunk of
// each bucket as views built once (the buffers never move).
void ZeroOptimizer::add_segments(ZeroGroup& g, int64_t grad_numel, at::ScalarType gradient_dtype, int rank) {
  const FlatLayout& L = g.layout;
  g.grads = at::zeros({gradients_to_host_ ? 0 : grad_numel}, data_.options(gradient_dtype));
  g.staging.resize(L.buckets.size());
  g.pending.resize(L.buckets.size());
  g.arrived.assign(L.params.size(), false);
  for (size_t b = 0; b < L.buckets.size(); ++b) {
    const FlatBucket& k = L.buckets[b];
    g.pending[b] = static_cast<int>(k.params.size());
    ShardSegment s;
    // The compute copy of this rank's chunk: in the whole buffer, or (stage 3) the shard itself.
    const int64_t flat = g.partitioned ? k.shard_offset : L.flat_of_local(rank, static_cast<int>(b));
    if (!gradients_to_host_) s.grads = stage_->gradient_chunk(g, static_cast<int>(b));
    s.params = g.mixed() ? g.master.narrow(0, k.shard_offset, k.shard) : g.compute.narrow(0, flat, k.shard);
    s.local_offset = k.shard_offset;
    if (g.mixed()) s.compute_copy = g.compute.narrow(0, flat, k.shard);
    g.segments.push_back(s);
  }
}

// The group's optimizer over its shard: the script's own (a client optimizer factory) stepping the
// views in place, or tessera's flat optimizer (its state where the StateSite keeps it).
void ZeroOptimizer::make_optimizer(ZeroGroup& g, const ZeroOptions& options, const ClientOptimizerFactory& client,
                                   int rank, Communicator* tensor) {
  const int64_t shard = g.layout.shard_numel;
  if (client) {
    // The script's own optimizer steps these views in place; NVMe offload would re-point them.
    if (options.nvme_optimizer || options.nvme_parameters)
      throw std::invalid_argument("tessera: a client optimizer (" + options.optimizer + ") steps the shards where "
                                  "they are in memory; NVMe offload is not available with it");
    g.optimizer = client(g.index, g.source_group, site_->segments(g), shard);
    if (!g.optimizer) throw std::invalid_argument("tessera: the client optimizer factory returned no optimizer");
  } else {
    g.optimizer = make_flat_optimizer(options.optimizer, options.hyper, options.nvme_optimizer ? 0 : shard,
                                      site_->state_options(data_.options(at::kFloat)), optimizer_context(g, rank, tensor));
  }
  if (options.nvme_optimizer && !g.optimizer->elementwise())
    throw std::invalid_argument(std::string("tessera: NVMe optimizer offload streams the state tile by tile, which ") +
                                g.optimizer->name() + " cannot do (its trust ratios need whole parameters): use "
                                "Adam, AdamW or SGD, or offload_optimizer.device \"none\"");
}

// Fills bucket b of the compute buffer (or its gathered buffer at stage 3) and the fp32 master
// shard from the model's tensors AS DATA-PARALLEL RANK 0 HOLDS THEM, as DDP and DeepSpeed do at
// construction: ranks that initialized their model differently (another seed) start from
// identical parameters. The values travel in fp32 (the master shard is exact, not rounded through
// the compute dtype) in pieces of at most 2^24 elements: one broadcast per piece of the bucket's
// whole tensors, one allgather per run of its partitioned ones (their chunks, zero/partitioned_init.h);
// no per-parameter collectives, and a transient of at most 64 MiB on top of the model's tensors,
// the compute buffer and the master shard.
void ZeroOptimizer::fill_bucket(ZeroGroup& g, int b, const std::vector<at::Tensor>& params,
                                const std::vector<at::Tensor>& shards, int rank) {
  constexpr int64_t kPiece = int64_t(1) << 24;
  const FlatLayout& L = g.layout;
  const FlatBucket& k = L.buckets[b];
  Communicator& over = *g.comm;  // rank 0 of the group's own communicator holds the values
  const int ranks = over.size();
  at::Tensor whole = g.partitioned ? g.gathered[b] : g.compute.narrow(0, k.offset, k.numel);
  // Bucket elements [begin, begin + values.numel()) are known: into the bucket and this rank's
  // chunk of it, [rank·shard, (rank+1)·shard), in the master shard and (stage 3) the compute shard.
  auto place = [&](int64_t begin, const at::Tensor& values) {
    const int64_t end = begin + values.numel();
    whole.narrow(0, begin, end - begin).copy_(values);
    if (!g.mixed() && !g.partitioned) return;
    const int64_t lo = std::max(begin, rank * k.shard), hi = std::min(end, (rank + 1) * k.shard);
    if (lo >= hi) return;
    const int64_t local = k.shard_offset + lo - rank * k.shard;
    if (g.mixed()) g.master.narrow(0, local, hi - lo).copy_(values.narrow(0, lo - begin, hi - lo));
    if (g.partitioned) g.compute.narrow(0, local, hi - lo).copy_(values.narrow(0, lo - begin, hi - lo));
  };
  auto offset_in_bucket = [&](int p) { return L.params[p].offset - k.offset; };
  std::vector<int> whole_params, chunked;
  for (int p : k.params) (shards[p].defined() ? chunked : whole_params).push_back(p);

  // Whole tensors (and the padding, zeros): rank 0's, broadcast piece by piece.
  if (!whole_params.empty() || chunked.empty())
    for (int64_t begin = 0; begin < k.numel; begin += kPiece) {
      const int64_t end = std::min(k.numel, begin + kPiece);
      at::Tensor values = at::zeros({end - begin}, over.options(at::kFloat));
      for (int p : whole_params) {
        const int64_t p_begin = offset_in_bucket(p), p_end = p_begin + L.params[p].numel;
        const int64_t lo = std::max(begin, p_begin), hi = std::min(end, p_end);
        if (lo < hi)
          values.narrow(0, lo - begin, hi - lo).copy_(params[p].detach().reshape({-1}).narrow(0, lo - p_begin, hi - lo));
      }
      if (ranks > 1) over.broadcast(values, 0);
      place(begin, values);
    }
  else {  // the padding (zeros in every copy)
    whole.zero_();
    if (g.mixed()) g.master.narrow(0, k.shard_offset, k.shard).zero_();
    if (g.partitioned) g.compute.narrow(0, k.shard_offset, k.shard).zero_();
  }

  // Partitioned tensors: every rank's chunks of a run of them in one allgather, each parameter
  // then rank 0's chunk, rank 1's, ... cut to its size.
  const int me = over.rank();  // the allgather's slot (not the shard rank: 0 for all at stage 0)
  const int64_t piece_per_rank = std::max<int64_t>(1, kPiece / ranks);
  for (size_t first = 0; first < chunked.size();) {
    size_t last = first;
    int64_t per_rank = 0;
    while (last < chunked.size() && (last == first || per_rank + shards[chunked[last]].numel() <= piece_per_rank))
      per_rank += shards[chunked[last++]].numel();
    if (per_rank > piece_per_rank) {
      // One parameter larger than a piece: its chunks travel piece by piece, rank r's piece k being
      // elements [r·c + k·P, ...) of the parameter.
      const int p = chunked[first];
      const at::Tensor chunk = shards[p].reshape({-1});
      const int64_t c = chunk.numel(), n = L.params[p].numel;
      for (int64_t from = 0; from < c; from += piece_per_rank) {
        const int64_t len = std::min(piece_per_rank, c - from);
        at::Tensor all = at::empty({ranks * len}, over.options(at::kFloat));
        at::Tensor mine = all.narrow(0, me * len, len);
        mine.copy_(chunk.narrow(0, from, len));
        if (ranks > 1) over.all_gather(mine, all);
        for (int r = 0; r < ranks; ++r) {
          const int64_t at = r * c + from, count = std::min(len, n - at);
          if (count > 0) place(offset_in_bucket(p) + at, all.narrow(0, r * len, count));
        }
      }
      first = last;
      continue;
    }
    at::Tensor all = at::empty({ranks * per_rank}, over.options(at::kFloat));
    at::Tensor mine = all.narrow(0, me * per_rank, per_rank);
    int64_t offset = 0;
    for (size_t i = first; i < last; ++i) {
      const at::Tensor& chunk = shards[chunked[i]];
      mine.narrow(0, offset, chunk.numel()).copy_(chunk.reshape({-1}));
      offset += chunk.numel();
    }
    if (ranks > 1) over.all_gather(mine, all);
    at::Tensor grid = all.view({ranks, per_rank});
    offset = 0;
    for (size_t i = first; i < last; ++i) {
      const int p = chunked[i];
      const int64_t c = shards[p].numel();
      place(offset_in_bucket(p), grid.narrow(1, offset, c).reshape({-1}).narrow(0, 0, L.params[p].numel));
      offset += c;
    }
    first = last;
  }
}

// The hooks point at this object: taken off the parameters, which may outlive the engine.
void ZeroOptimizer::remove_grad_hooks() {
  for (auto& g : groups_)
    for (auto& p : g->params) {
      if (!p.defined()) continue;  // a group whose construction stopped part way
      auto& hook = torch::autograd::impl::post_acc_grad_hooks(p);
      auto* ours = dynamic_cast<GradReadyHook*>(hook.get());
      if (ours && ours->owner() == this) hook.reset();
    }
}

// super_offload: a group is speculated when its chunks can be stepped one by one (an elementwise
// optimizer: Adam, AdamW, SGD) on host copies the model does not read before apply() finishes
// them: the host step with the state in memory, and not a ZeRO-3 shard that is itself in host
// memory or a file (the backward's gathers read it). engine/runnable.cpp names the keys.
void ZeroOptimizer::make_speculation(const ZeroOptions& options) {
  if (!site_->on_host() || state_->in_files() || delayed_update_after_ >= 0)
    throw std::invalid_argument("tessera: a speculated step (super_offload) needs the optimizer's host step with its "
                                "state in host memory, without a delayed parameter update");
  std::vector<int> buckets;
  bool any = false;
  for (const auto& g : groups_) {
    const bool speculated = g->optimizer->elementwise() && !site_->holds_shard(*g) && !params_->in_files(*g);
    buckets.push_back(speculated ? static_cast<int>(g->layout.buckets.size()) : 0);
    any = any || speculated;
  }
  if (!any)
    throw std::invalid_argument("tessera: a speculated step (super_offload) steps bucket by bucket during the "
                                "backward: it needs an elementwise optimizer (Adam, AdamW, SGD) at ZeRO stage 1-3");
  speculation_ = std::make_unique<SpeculativeStep>(
      std::move(buckets),
      [this](int group, int bucket, const StepInputs& in) {
        ZeroGroup& g = *groups_[group];
        g.optimizer->step(in, {site_->segments(g)[bucket]});
      },
      [this](int group, int bucket) {
        ZeroGroup& g = *groups_[group];
        const ShardSegment& s = site_->segments(g)[bucket];
        std::vector<at::Tensor> arrays{s.params};
        if (s.compute_copy.defined()) arrays.push_back(s.compute_copy);
        for (const auto& [name, state] : g.optimizer->named_state())
          arrays.push_back(state.narrow(0, s.local_offset, s.params.numel()));
        return arrays;
      },
      options.speculation_threads_share, options.speculation_fault);
}

}  // namespace tessera
