// Model states per rank: what the engine allocates, stage by stage (docs/zero.md, docs/estimator.md).
#include "engine/estimator/estimator.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <stdexcept>

#include "engine/estimator/estimator_detail.h"
#include "offload/swap_tiles.h"
#include "zero/buffer_plan.h"

namespace tessera {

using namespace estimator_detail;

namespace estimator_detail {

// Parameter groups: the engine keeps one flat layout per group. `keys` (optional): each group's
// number (2 and 3: an MoE model's experts).
std::vector<std::vector<int64_t>> group_numels(const StageModel& m, const TrainingSetup& s, std::vector<int>* keys) {
  std::map<int, std::vector<int64_t>> groups;
  for (const auto& t : m.tensors) groups[s.param_groups == 1 && t.group < 2 ? 0 : t.group].push_back(t.numel);
  std::vector<std::vector<int64_t>> out;
  for (auto& [g, numels] : groups)
    if (!numels.empty()) {
      out.push_back(std::move(numels));
      if (keys) keys->push_back(g);
    }
  return out;
}

// ---- model states --------------------------------------------------------------------------

// Per rank, in bytes, by where they live.


bool engine_runs(const TrainingSetup& s, bool cpu_device) {
  // The optimizer's offload runs at stages 1-3 on CPU and GPU ranks; the parameters' at stage 3 on
  // CPU ranks, and on GPU ranks (to host memory or NVMe) when the optimizer is offloaded too.
  const bool optimizer_offload_runs = s.offload_optimizer == "none" || s.zero_stage >= 1;
  const bool param_offload_runs =
      s.offload_param == "none" || (s.zero_stage == 3 && (cpu_device || s.offload_optimizer != "none"));
  return s.zero_stage <= 3 && optimizer_offload_runs && param_offload_runs && s.tp == 1 && s.pp == 1;
}

namespace {
// The NVMe optimizer swapper's file and tile buffers (offload/optimizer_swapper.h): the state, and
// the master with mixed precision, per tile of each bucket's shard segment (the swapper's rule,
// offload/swap_tiles.h), each slot aligned to 4096; in memory only buffer_count slots.
struct SwapFiles {
  int64_t file = 0, largest_slot = 0;
};
SwapFiles optimizer_swap_files(const BufferPlan& plan, const TrainingSetup& s, int arrays) {
  SwapFiles f;
  for (const GroupBuffers& g : plan.groups)
    for (const FlatBucket& b : g.layout.buckets)
      for (int64_t begin = 0, tile = optimizer_swap_tile_numel(s.sub_group_size, b.shard); begin < b.shard;
           begin += tile) {
        const int64_t slot = (4 * std::min(tile, b.shard - begin) * arrays + 4095) / 4096 * 4096;
        f.file += slot;
        f.largest_slot = std::max(f.largest_slot, slot);
      }
  return f;
}
}  // namespace

States model_states(const StageModel& m, const TrainingSetup& s, int dp, bool cpu_device) {
  States st;
  const int c = compute_bytes(s), k = state_bytes_per_param(s);
  const bool mixed = mixed_precision(s);
  // On CPU ranks offload is the engine's: "cpu" changes nothing, "nvme" is planned below.
  const bool engine_offload = cpu_device && (s.offload_optimizer != "none" || s.offload_param != "none");
  const bool off_opt = s.offload_optimizer != "none" && !engine_offload;
  const bool off_param = s.offload_param != "none" && !engine_offload;
  // On GPU ranks the engine's host path (zero/zero_optimizer.h, host_optimizer/host_parameters).
  const bool gpu_host_offload = !cpu_device && off_opt && engine_runs(s, false);
  // ...where offload_param "cpu" puts each partitioned group's shard in host memory, and "nvme" in
  // files read through host swap buffers: either way no partitioned shard stays on the device.
  const bool shards_on_host = gpu_host_offload && s.offload_param == "cpu";
  const bool shards_in_files = gpu_host_offload && s.offload_param == "nvme";
  std::vector<int> keys;
  const auto groups = group_numels(m, s, &keys);
  // An MoE model's experts (groups 2-3) are partitioned over their expert-data group, dp/ep ranks.
  const int expert_dp = s.moe ? std::max<int>(1, dp / static_cast<int>(s.moe->ep_size)) : dp;
  const int staging_buffers = std::max<int>(static_cast<int>(groups.size()), s.param_groups);
  const std::string dtype = s.precision;

  if (s.zero_stage <= 2 || (s.zero_stage == 3 && !off_opt && !off_param) || gpu_host_offload) {
    // The engine's own buffer planner (zero/buffer_plan.h): the figures are what it allocates.
    BufferPlanInput in;
    in.group_numels = groups;
    for (int key : keys) in.group_partitions.push_back(key >= 2 ? expert_dp : dp);
    if (s.zero_stage == 3) {
      // As the engine splits them: each group's partitioned tensors, then its persistent ones
      // (fewer elements than stage3_param_persistence_threshold), each kind a group of its own.
      in.group_numels.clear();
      in.group_partitions.clear();
      for (size_t gi = 0; gi < groups.size(); ++gi)
        for (bool partitioned : {true, false}) {
          std::vector<int64_t> kind;
          for (auto n : groups[gi])
            if ((n >= s.stage3_param_persistence_threshold) == partitioned) kind.push_back(n);
          if (kind.empty()) continue;
          in.group_numels.push_back(std::move(kind));
          in.group_partitioned.push_back(partitioned);
          in.group_partitions.push_back(keys[gi] >= 2 ? expert_dp : dp);
        }
    }
    in.stage = s.zero_stage;
    in.data_parallel = dp;
    in.compute_bytes = c;
    in.bucket_numel = s.reduce_bucket_size;
    in.state_floats = k / 4;
    in.gradient_bytes = s.grad_accum_dtype == "bf16" ? 2 : 4;
    const std::string wire = s.communication_dtype.empty() ? s.grad_accum_dtype : s.communication_dtype;
    in.wire_bytes = wire == "fp32" ? 4 : 2;
    const BufferPlan plan = plan_buffers(in);
    const int partitions = plan.partitions;
    int64_t total = 0, shard = 0;
    // Construction (ZeroOptimizer's constructor, group by group): the model's own fp32 tensors
    // not yet re-pointed, this group's compute buffer and master shard (copied straight from the
    // model's tensors), and the earlier groups' compute buffers and master shards.
    int64_t remaining_model = 4 * m.params, built = 0;
    for (size_t gi = 0; gi < plan.groups.size(); ++gi) {
      const GroupBuffers& g = plan.groups[gi];
      total += g.layout.total;
      shard += g.layout.shard_numel;
      int64_t group_params = 0;
      for (auto n : in.group_numels[gi]) group_params += n;
      // At stage 3 the engine is built whole (every bucket gathered) and released at the first unit.
      const bool shard_off_device = (shards_on_host || shards_in_files) && g.partitioned;
      const int64_t compute = int64_t(c) * ((shard_off_device ? 0 : g.compute_numel) + (g.partitioned ? g.layout.total : 0));
      const int64_t master = off_opt ? 0 : 4 * g.master_numel;
      st.construction = std::max(st.construction, remaining_model + built + compute + master);
      remaining_model -= 4 * group_params;
      built += compute + master;
    }
    st.params = plan.parameter_bytes;
    st.params_detail = dtype + (s.zero_stage == 3 ? ", " + part(dp) + " (small tensors whole)" : ", whole");
    if ((engine_offload || shards_in_files) && s.offload_param == "nvme" && s.zero_stage == 3) {
      // The engine's parameter swap files (offload/parameter_swapper.h): each partitioned group's
      // shard, one chunk per bucket aligned to 4096; in memory buffer_count buffers of the largest
      // (the host's beside a GPU).
      int64_t file = 0, largest = 0;
      for (const GroupBuffers& g : plan.groups) {
        if (!g.partitioned) continue;
        st.params -= int64_t(c) * g.compute_numel;
        for (const FlatBucket& b : g.layout.buckets) {
          const int64_t chunk = (int64_t(c) * b.shard + 4095) / 4096 * 4096;
          file += chunk;
          largest = std::max(largest, chunk);
        }
      }
      st.n_params = file;
      (shards_in_files ? st.h_params : st.params) += int64_t(std::max(1, s.param_buffer_count)) * largest;
      st.params_detail = dtype + ", small tensors whole; " + std::to_string(s.param_buffer_count) + " swap buffers of " +
                         format_gib(largest) + (shards_in_files ? " in host memory" : "") + " (the shards are on NVMe)";
    }
    if (s.tp * s.pp > 1) st.params_detail += " (this rank's tp/pp share: " + count_str(m.params) + ")";
    // The engine's gradient buffer on the device; on GPU ranks with the optimizer on the host at
    // stages 2-3 each reduced chunk goes to the host's copy, and the device keeps none.
    if (!off_opt || (gpu_host_offload && s.zero_stage < 2)) {
      st.grads = plan.gradient_bytes;
      st.grads_detail = std::string(s.zero_stage < 2 && s.grad_accum_dtype == "bf16" ? "bf16, " : "fp32, ") +
                        part(s.zero_stage >= 2 ? dp : 1);
    }
    if (!off_opt) {
      if (mixed) st.master = plan.master_bytes, st.master_detail = part(partitions);
      st.optim = plan.state_bytes;
      st.optim_detail = state_name(s) + ", " + part(partitions);
      if (engine_offload && s.offload_optimizer == "nvme") {
        const SwapFiles f = optimizer_swap_files(plan, s, k / 4 + (mixed ? 1 : 0));
        st.n_optim = f.file;
        st.optim = int64_t(std::max(1, s.optimizer_buffer_count)) * f.largest_slot;
        st.optim_detail = std::to_string(s.optimizer_buffer_count) + " tile buffers of " + format_gib(f.largest_slot) +
                          " (the state" + (mixed ? " and fp32 master" : "") + " is on NVMe)";
        if (mixed) st.master = 0, st.master_detail.clear();
      }
    } else if (gpu_host_offload) {
      // The GPU keeps the compute-dtype parameters and (stage 1) its gradient buffer; the host, per
      // group, the gradient shard (a copy at stage 1; at 2-3 where the reduced chunks accumulate), the fp32 master (mixed precision; in its file with NVMe) or
      // a host fp32 copy of the parameters (fp32), the compute-dtype copy the step writes (mixed),
      // and the state (or NVMe's tile buffers). With offload_param "cpu" a partitioned group's
      // shard is allocated on the host and is that copy.
      const bool nvme = s.offload_optimizer == "nvme";
      const int grad_bytes = s.grad_accum_dtype == "bf16" ? 2 : 4;
      for (const GroupBuffers& g : plan.groups) {
        const int64_t shard_numel = g.layout.shard_numel;
        const bool shard_on_host = shards_on_host && g.partitioned;
        st.h_grads += int64_t(grad_bytes) * shard_numel;
        // super_offload (zero/speculative_step.h): what a step writes, copied aside before each
        // speculated chunk's step: the fp32 master (or host copy), the compute copy, the state.
        if (s.super_offload && !nvme && !shard_on_host)
          st.h_optim += shard_numel * (4 + (mixed ? c : 0) + k);
        if (shards_in_files && g.partitioned) {
          // the swap buffers (above) are the copy the step writes
        } else if (shard_on_host) {
          st.params -= int64_t(c) * g.compute_numel;
          st.h_params += int64_t(c) * g.compute_numel;
        } else if (mixed) {
          st.h_params += int64_t(c) * shard_numel;  // the compute-dtype copy
        } else {
          st.h_master += 4 * shard_numel;  // the host's fp32 copy of the parameters
        }
      }
      if (mixed && !nvme) st.h_master += plan.master_bytes;
      if (nvme) {
        const SwapFiles f = optimizer_swap_files(plan, s, k / 4 + (mixed ? 1 : 0));
        st.n_optim = f.file;
        st.h_optim = int64_t(std::max(1, s.optimizer_buffer_count)) * f.largest_slot;
      } else {
        st.h_optim += plan.state_bytes;
      }
      if (shards_on_host) st.params_detail = dtype + ", small tensors whole (the shards are in host memory)";
    } else {
      // Design (not in the engine yet): the optimizer runs on the host over this rank's shard;
      // stage 1 still accumulates the full fp32 gradient on the device until the boundary.
      if (s.zero_stage == 1) st.grads = 4 * total, st.grads_detail = "fp32 accumulation, whole";
      int64_t* master = s.offload_optimizer == "cpu" ? &st.h_master : &st.n_master;
      int64_t* grads = s.offload_optimizer == "cpu" ? &st.h_grads : &st.n_grads;
      int64_t* optim = s.offload_optimizer == "cpu" ? &st.h_optim : &st.n_optim;
      *master = 4 * shard, *grads = 4 * shard, *optim = int64_t(k) * shard;
      if (s.offload_optimizer == "nvme") {
        st.h_pinned = int64_t(s.optimizer_buffer_count) * optimizer_swap_tile_numel(s.sub_group_size, shard) * 4;
        st.h_pinned_detail = std::to_string(s.optimizer_buffer_count) + " optimizer swap buffers";
      }
    }
    // Communication buffers: the planner's bound, which the engine reaches (zero/buffer_plan.h).
    st.buckets = plan.communication_bytes;
    if (s.zero_stage >= 2)
      st.buckets_detail = std::to_string(plan.staging_buffers) + " fp32 staging buffer" +
                          (plan.staging_buffers > 1 ? "s" : "") + " (2 per group: fill one, reduce the other), " +
                          "largest " + count_str(plan.largest_bucket) + " elements";
    if (s.zero_stage == 3) {
      // Gathered for compute (not planned: it follows the units): the current unit plus what is
      // prefetched, bounded by stage3_max_live_parameters, and its gradient before it is folded.
      const int64_t live = std::min({s.stage3_max_live_parameters, m.largest + s.stage3_prefetch_bucket_size, m.params});
      st.gathered = int64_t(c) * (live + m.largest);
      st.gathered_detail = "largest module " + count_str(m.largest) + " + prefetch, and its gradient";
    }
    return st;
  }

  // ZeRO-3 (design estimate): each tensor partitioned over dp (padded per tensor, as DeepSpeed),
  // tensors of at most stage3_param_persistence_threshold elements kept whole.
  int64_t shard = 0, persistent = 0, sharded_total = 0;
  for (const auto& numels : groups)
    for (auto n : numels) {
      shard += ceil_div(n, dp);
      if (n <= s.stage3_param_persistence_threshold) persistent += n;
      else sharded_total += ceil_div(n, dp);
    }
  if (!off_param) {
    st.params = int64_t(c) * (sharded_total + persistent);
    st.params_detail = dtype + ", " + part(dp) + (persistent ? " + small persistent tensors whole" : "");
  } else {
    st.params = int64_t(c) * persistent;
    st.params_detail = dtype + ", persistent small tensors only";
    if (s.offload_param == "cpu") st.h_params = int64_t(c) * sharded_total;
    else {
      st.n_params = int64_t(c) * sharded_total;
      st.h_pinned += int64_t(s.param_buffer_count) * s.param_buffer_size * c;
      st.h_pinned_detail = std::to_string(s.param_buffer_count) + " parameter swap buffers";
    }
  }
  // Gathered for compute: the current module plus prefetched ones (bounded by max_live), and the
  // module's gradient in the compute dtype before it is folded into the fp32 buckets.
  const int64_t live = std::min({s.stage3_max_live_parameters, m.largest + s.stage3_prefetch_bucket_size, m.params});
  st.gathered = int64_t(c) * (live + m.largest);
  st.gathered_detail = "largest module " + count_str(m.largest) + " + prefetch, and its gradient";
  const double ratio = off_opt ? s.offload_optimizer_ratio : 0.0;
  const int64_t master = mixed || off_opt ? 4 * shard : 0, grads = 4 * shard, optim = int64_t(k) * shard;
  auto split = [&](int64_t bytes, int64_t& device, int64_t& host, int64_t& nvme) {
    const int64_t away = round_bytes(bytes * ratio);
    device = bytes - away;
    (s.offload_optimizer == "nvme" ? nvme : host) += away;
  };
  split(master, st.master, st.h_master, st.n_master);
  split(grads, st.grads, st.h_grads, st.n_grads);
  split(optim, st.optim, st.h_optim, st.n_optim);
  st.master_detail = part(dp);
  st.grads_detail = "fp32, " + part(dp);
  st.optim_detail = state_name(s) + ", " + part(dp);
  if (s.offload_optimizer == "nvme") {
    st.h_pinned += int64_t(s.optimizer_buffer_count) * optimizer_swap_tile_numel(s.sub_group_size, shard) * 4;
    st.h_pinned_detail += std::string(st.h_pinned_detail.empty() ? "" : ", ") +
                          std::to_string(s.optimizer_buffer_count) + " optimizer swap buffers";
  }
  // Gradient staging as at stage 2: reduce_bucket_size fp32 elements per concurrently filling bucket.
  const int64_t bucket = std::min(s.reduce_bucket_size, m.params);
  st.buckets = int64_t(staging_buffers) * 4 * bucket + (dp > 1 ? int64_t(staging_buffers) * 4 * ceil_div(bucket, dp) : 0);
  st.buckets_detail = std::to_string(staging_buffers) + " fp32 staging buffer" + (staging_buffers > 1 ? "s" : "") +
                      " of " + count_str(bucket) + " elements" + (dp > 1 ? " + receive chunks" : "");
  st.construction = 4 * m.largest;  // built partitioned, as DeepSpeed's zero.Init
  return st;
}

}  // namespace estimator_detail
}  // namespace tessera
