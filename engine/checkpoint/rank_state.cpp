#include "engine/checkpoint/rank_state.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <stdexcept>

#include "engine/config/config.h"
#include "parallel/parallel_context.h"
#include "zero/zero_optimizer.h"

namespace tessera::checkpoint {

using StateLayout = FlatOptimizer::StateLayout;

RankState rank_state(ZeroOptimizer& zero, ParallelContext& parallel) {
  const Coordinates coords = parallel.coordinates();
  RankState out;
  out.pipeline_stage = coords.pipe;
  bool first_group = true;
  for (const auto& gp : zero.groups()) {
    const ZeroGroup& g = *gp;
    // A group is laid out over its own communicator (the data group, or an MoE layer's expert-data
    // group, whose parameters are named by their global expert so that every expert is saved once).
    const int shard_rank = zero.shard_rank(g);
    // At stage 0 every rank of the group holds the same shard: its rank 0 writes it.
    const bool owns_shard = zero.stage() > 0 || g.comm->rank() == 0;
    const int tensor_rank = g.tensor_sharded ? coords.tensor : -1;
    const bool writes = owns_shard && (g.tensor_sharded || coords.tensor == 0);
    // The optimizer's state by layout.
    NamedTensors shard_states, per_parameter;
    GroupView view;
    view.first_parameter = g.names.front();
    view.tensor_rank = tensor_rank;
    // Wherever the state lives (NVMe: read from the swap file, with the master when it is there).
    CheckpointState state = zero.checkpoint_state(g.index);
    NamedTensors named = std::move(state.named);
    const at::Tensor offloaded_master = state.master;
    if (state.from_files) out.offloaded.emplace_back(g.index, std::move(state.arrays));
    for (auto& [name, t] : named) {
      switch (g.optimizer->state_layout(name)) {
        case StateLayout::Shard:
          if (t.numel() != g.layout.shard_numel)
            throw std::logic_error("tessera: optimizer state " + name + " has " + std::to_string(t.numel()) +
                                   " elements, not the shard's " + std::to_string(g.layout.shard_numel));
          shard_states.emplace_back(name, t);
          break;
        case StateLayout::PerParameter: per_parameter.emplace_back(name, t); break;
        case StateLayout::Group: view.group_states.emplace_back(name, t); break;
        case StateLayout::Uniform:
          view.group_states.emplace_back(name, t);
          view.uniform.push_back(name);
          break;
        case StateLayout::RankLocal: view.rank_local.emplace_back(name, t); break;
      }
    }
    if (first_group) {
      out.shard_states.push_back("fp32");
      if (g.mixed()) out.shard_states.push_back("compute");
      for (const auto& [name, t] : shard_states) out.shard_states.push_back(name);
      first_group = false;
    }
    for (const ShardPiece& piece : g.layout.pieces(shard_rank)) {
      if (piece.numel == 0) continue;
      const ShardSegment& s = g.segments[g.layout.params[piece.param].bucket];
      const int64_t within = piece.local_offset - s.local_offset;
      PieceView p;
      p.name = g.names[piece.param];
      p.shape = g.params[piece.param].sizes().vec();
      p.dtype = g.params[piece.param].scalar_type();
      p.tensor_rank = tensor_rank;
      if (g.tensor_sharded) p.split = g.tensor_splits[piece.param];
      p.begin = piece.param_offset;
      p.numel = piece.numel;
      p.states.emplace_back("fp32", offloaded_master.defined() ? offloaded_master.narrow(0, piece.local_offset, piece.numel)
                                                               : s.params.narrow(0, within, piece.numel));
      if (g.mixed()) p.compute = s.compute_copy.narrow(0, within, piece.numel);
      for (const auto& [name, t] : shard_states) p.states.emplace_back(name, t.narrow(0, piece.local_offset, piece.numel));
      if (piece.param_offset == 0)
        for (const auto& [name, t] : per_parameter) p.per_parameter.emplace_back(name, t.narrow(0, piece.param, 1));
      out.pieces.push_back(std::move(p));
      out.writes_piece.push_back(writes);
    }
    out.groups.push_back(std::move(view));
    out.writes_group.push_back(writes && shard_rank == 0);
  }
  return out;
}

Layout current_layout(TrainingState& s, const std::vector<std::string>& shard_states) {
  Layout l;
  const GridShape& grid = s.parallel.grid();
  l.world_size = s.parallel.world_size();
  l.data_parallel = grid.data;
  l.tensor_parallel = grid.tensor;
  l.pipeline_parallel = grid.pipe;
  l.zero_stage = s.zero.stage();
  l.optimizer = s.config.optimizer->type;
  const at::ScalarType compute = s.zero.groups().front()->params.front().scalar_type();
  l.compute_dtype = compute == at::kBFloat16 ? "bf16" : compute == at::kHalf ? "fp16" : "fp32";
  l.states = shard_states;
  return l;
}

// The generators a checkpoint saves: CPU's, and the collectives' device's when it is not the CPU.
std::vector<std::pair<std::string, at::Generator>> generators(const c10::Device& device) {
  std::vector<std::pair<std::string, at::Generator>> out{{"rng/cpu", at::detail::getDefaultCPUGenerator()}};
  if (!device.is_cpu()) out.emplace_back("rng/" + device.str(), at::globalContext().defaultGenerator(device));
  return out;
}

std::vector<std::string> rng_names(const c10::Device& device) {
  std::vector<std::string> out;
  for (auto& [name, gen] : generators(device)) out.push_back(name);
  return out;
}

NamedTensors rng_states(const c10::Device& device) {
  NamedTensors out;
  for (auto& [name, gen] : generators(device)) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    out.emplace_back(name, gen.get_state());
  }
  return out;
}

void set_rng_states(const c10::Device& device, const NamedTensors& states) {
  for (auto& [name, gen] : generators(device))
    for (const auto& [saved, state] : states)
      if (saved == name) {
        std::lock_guard<std::mutex> lock(gen.mutex());
        gen.set_state(state);
      }
}

std::vector<std::string> all_gather_strings(Communicator& group, const std::string& text) {
  const int n = group.size();
  if (n == 1) return {text};
  // The lengths, then every text padded to the longest (an allgather takes equal chunks).
  at::Tensor lengths = at::zeros({n}, group.options(at::kLong));
  lengths.narrow(0, group.rank(), 1).fill_(static_cast<int64_t>(text.size()));
  group.all_gather(lengths.narrow(0, group.rank(), 1), lengths);
  const at::Tensor sizes = lengths.cpu();
  const int64_t longest = std::max<int64_t>(1, sizes.max().item<int64_t>());
  at::Tensor own = at::zeros({longest}, at::TensorOptions().dtype(at::kByte));
  std::copy(text.begin(), text.end(), static_cast<char*>(own.data_ptr()));
  at::Tensor all = at::zeros({n * longest}, group.options(at::kByte));
  all.narrow(0, group.rank() * longest, longest).copy_(own);
  group.all_gather(all.narrow(0, group.rank() * longest, longest), all);
  all = all.cpu();
  std::vector<std::string> out;
  const char* data = static_cast<const char*>(all.data_ptr());
  for (int r = 0; r < n; ++r) out.emplace_back(data + r * longest, static_cast<size_t>(sizes[r].item<int64_t>()));
  return out;
}

void agree(Communicator& group, const std::string& error, const std::string& what) {
  const std::vector<std::string> errors = all_gather_strings(group, error);
  if (!error.empty()) throw std::runtime_error(error);
  for (size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty())
      throw std::runtime_error("tessera: " + what + " failed on rank " + std::to_string(group.global_ranks()[r]) +
                               ": " + errors[r]);
}

}  // namespace tessera::checkpoint
