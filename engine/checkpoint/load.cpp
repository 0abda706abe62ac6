// Engine load (engine_checkpoint.h): every rank reads the ranges its shard owns now, from whichever
// files hold them, checks each against its checksum, and changes nothing until every rank has
// read everything it needs.
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "engine/checkpoint/engine_checkpoint.h"
#include "engine/checkpoint/metadata.h"
#include "engine/checkpoint/rank_state.h"
#include "engine/checkpoint/reshard.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/config/config.h"
#include "engine/config/config_rules.h"
#include "optim/loss_scaler.h"
#include "parallel/parallel_context.h"
#include "zero/zero_optimizer.h"

namespace tessera {

using nlohmann::json;
using namespace checkpoint;

namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

const ShardRecord& first_shard(const ParameterRecord& p) { return p.shards.front(); }

}  // namespace

LoadResult load_checkpoint(TrainingState& s, const LoadOptions& o) {
  Communicator& world = s.parallel.world();
  const bool optimizer = o.load_optimizer_states && !o.load_module_only;
  const bool printer = s.parallel.rank() == 0;
  s.zero.wait_for_parameters();

  // 1. Read and check everything this rank needs; change nothing yet.
  struct Copy {
    at::Tensor into, from;  // `from` undefined: zeros
  };
  std::vector<Copy> copies;
  NamedTensors rng;
  std::vector<std::string> notes;
  Metadata m;
  std::string path, error;
  at::Tensor matched;
  StepCounters steps = s.steps;
  std::optional<DynamicLossScaler::State> scaler_state;
  // NVMe parameter offload: the shards in memory while the rank's view reads or fills them
  // (opened inside the try: a failed read is agreed on by every rank like any other).
  std::optional<ZeroOptimizer::ResidentParameters> resident;
  RankState rs;
  // Until the values are taken (step 3), a failed load leaves no optimizer state it made behind.
  struct DiscardUnlessTaken {
    ZeroOptimizer& zero;
    bool materialized = false, taken = false;
    ~DiscardUnlessTaken() {
      if (materialized && !taken) zero.discard_materialized_optimizer_state();
    }
  } made{s.zero};
  try {
    path = checkpoint_path(o.load_dir, o.tag);
    m = Metadata::read(path);
    resident.emplace(s.zero);
    // State that appears at an optimizer's first step (a client torch optimizer's) is made now
    // when the checkpoint has some to load into it: it was saved after applied optimizer steps.
    if (optimizer && m.engine.is_object()) {
      const json& e = m.engine;
      if (e.at("global_step").get<int64_t>() - e.at("skipped_steps").get<int64_t>() -
              e.at("optimizer_step_base").get<int64_t>() > 0)
        made.materialized = s.zero.materialize_optimizer_state();
    }
    rs = rank_state(s.zero, s.parallel);
    const Layout now = current_layout(s, rs.shard_states);
    if (optimizer && !equals_ignoring_case(m.layout.optimizer, now.optimizer))  // the config's type is case-insensitive
      throw std::runtime_error("tessera: checkpoint " + path + " holds " + m.layout.optimizer + " state; this engine runs " +
                               now.optimizer + ": load it with load_optimizer_states=False (the weights alone)");
    const bool same_layout = m.layout == now;
    CheckpointFiles files(path, m);
    const SavedParameters saved(m);
    matched = at::zeros({static_cast<int64_t>(m.parameters.size()) + 1}, at::kInt);
    const bool has_compute = std::count(m.layout.states.begin(), m.layout.states.end(), "compute") > 0;
    const std::string weights = o.load_from_fp32_weights || !has_compute ? "fp32" : "compute";
    const int tensor_ranks = s.parallel.grid().tensor;

    // Every parameter of this rank's model is in the checkpoint (on any stage, whole or in slices),
    // with its whole shape.
    for (const auto& gp : s.zero.groups()) {
      const ZeroGroup& g = *gp;
      for (size_t i = 0; i < g.params.size(); ++i) {
        const SavedParameter* p = saved.find(g.names[i]);
        if (p)
          for (size_t r : p->records) matched[static_cast<int64_t>(r)].fill_(1);
        if (!p && o.load_module_strict && g.params[i].numel() > 0)
          throw std::runtime_error("tessera: checkpoint " + path + " has no parameter " + g.names[i] +
                                   ": it was saved from another model (load_module_strict=False loads the parameters it has)");
        const std::vector<int64_t> shape = whole_shape_of(g.params[i].sizes().vec(), g.tensor_splits[i], tensor_ranks);
        if (p && !p->whole_shape.empty() && p->whole_shape != shape)
          throw std::runtime_error("tessera: checkpoint " + path + " holds " + g.names[i] + " with shape " +
                                   shape_str(p->whole_shape) + "; the model's is " + shape_str(shape) +
                                   (g.tensor_sharded ? " (whole; this rank holds a tensor-parallel slice of it)" : ""));
      }
    }
    // This rank's pieces: the weights, and the optimizer's state laid out by element or parameter.
    // Where the checkpoint holds the same cut of the parameter (the tensor-parallel degree and split
    // unchanged, the stage perhaps not), the piece's range is read as it is; otherwise its elements
    // are named in the whole parameter and gathered from the slices that hold them.
    for (const PieceView& piece : rs.pieces) {
      const SavedParameter* p = saved.find(piece.name);
      if (!p) continue;
      const ParameterRecord* same = p->same_cut(piece.tensor_rank, tensor_ranks, piece.split);
      at::Tensor elements;
      if (!same)
        elements = whole_indices(p->whole_shape, piece.split, std::max(piece.tensor_rank, 0), tensor_ranks, piece.begin,
                                 piece.numel);
      auto read = [&](const std::string& state) {
        return same ? read_range(files, *same, state, piece.begin, piece.numel) : read_elements(files, *p, state, elements);
      };
      copies.push_back({piece.states.front().second, read(weights)});
      if (!optimizer) continue;
      for (size_t k = 1; k < piece.states.size(); ++k) copies.push_back({piece.states[k].second, read(piece.states[k].first)});
      for (const auto& [state, t] : piece.per_parameter) {
        if (same)
          copies.push_back({t, files.read(first_shard(*same).file, state + "/" + piece.name)});
        else
          notes.push_back(state + " keeps its initial value (it is each tensor-parallel slice's own, and the slices changed)");
      }
    }
    // Group state (the same on every rank) and each rank's own (the same layout only).
    const std::string own_file = rank_file_name(s.parallel.rank());
    for (const GroupView& g : rs.groups) {
      if (!optimizer) break;
      if (!g.group_states.empty()) {
        // The same group: by its first parameter and tensor rank (any tensor rank's when the degree
        // changed: a group's state is the same on every rank), on this stage or the one that held it.
        const bool same_slices = m.layout.tensor_parallel == now.tensor_parallel;
        const bool regrouped = !same_slices || m.layout.pipeline_parallel != now.pipeline_parallel;
        const GroupRecord* found = nullptr;
        for (const GroupRecord& r : m.groups)
          if (r.first_parameter == g.first_parameter && (r.tensor_rank == g.tensor_rank || !same_slices) &&
              (!found || r.pipeline_stage == rs.pipeline_stage))
            found = &r;
        for (const auto& [state, t] : g.group_states) {
          // Grouped otherwise (ZeRO-3 splits a group into partitioned and persistent parameters; the
          // stages hold other layers): a value every group shares (Uniform) loads from any group
          // that saved it, this stage's first.
          const GroupRecord* holder = found;
          if (!holder && std::count(g.uniform.begin(), g.uniform.end(), state))
            for (const GroupRecord& r : m.groups)
              if (std::count(r.states.begin(), r.states.end(), state) &&
                  (!holder || (holder->pipeline_stage != rs.pipeline_stage && r.pipeline_stage == rs.pipeline_stage)))
                holder = &r;
          if (!holder && regrouped) {
            notes.push_back(state + " of the parameter group that begins with " + g.first_parameter +
                            " keeps its initial value (" + m.layout.str() + " grouped the parameters otherwise)");
            continue;
          }
          if (!holder)
            throw std::runtime_error("tessera: checkpoint " + path + " has no state for the parameter group that begins with " +
                                     g.first_parameter + " (" + m.layout.str() + " grouped the parameters otherwise)");
          copies.push_back({t, files.read(holder->file, "group/" + holder->first_parameter + "/" + state)});
        }
      }
      for (const auto& [state, t] : g.rank_local) {
        const std::string name = "local/" + g.first_parameter + "/" + state;
        if (same_layout && files.lists(own_file, name)) {
          copies.push_back({t, files.read(own_file, name)});
        } else {
          copies.push_back({t, at::Tensor()});
          notes.push_back(state + " starts from zero (it is each rank's own, and the layout changed)");
        }
      }
    }
    // The RNG states of the same rank, when there is one.
    if (!o.load_module_only) {
      if (m.layout.world_size == s.parallel.world_size()) {
        for (const std::string& name : rng_names(s.parallel.device()))
          if (files.lists(own_file, name)) rng.emplace_back(name, files.read(own_file, name));
      } else {
        notes.push_back("the RNG states are not restored (saved by " + std::to_string(m.layout.world_size) +
                        " ranks, loaded by " + std::to_string(s.parallel.world_size()) + ")");
      }
    }
    // The counters, the loss scaler.
    if (!o.load_module_only) {
      const json& e = m.engine;
      steps.global_step = e.at("global_step").get<int64_t>();
      steps.skipped_steps = e.at("skipped_steps").get<int64_t>();
      steps.micro_step = steps.global_step * *s.config.gradient_accumulation_steps;
      // A part not loaded starts afresh at the loaded step.
      steps.optimizer_step_base = optimizer ? e.at("optimizer_step_base").get<int64_t>()
                                            : steps.applied() - s.steps.optimizer_step();
      steps.schedule_step_base = o.load_lr_scheduler_states ? e.at("schedule_step_base").get<int64_t>()
                                                            : steps.applied() - s.steps.schedule_step();
      const json& scaler = e.at("loss_scaler");
      if (optimizer && scaler.at("type") == "dynamic" && dynamic_cast<DynamicLossScaler*>(&s.scaler))
        scaler_state = DynamicLossScaler::State{scaler.at("scale").get<double>(), scaler.at("cur_iter").get<int64_t>(),
                                                scaler.at("last_overflow_iter").get<int64_t>(),
                                                scaler.at("cur_hysteresis").get<int>()};
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree(world, error, "loading checkpoint " + (path.empty() ? o.load_dir : path));

  // 2. Parameters of the checkpoint that no rank's model holds.
  if (o.load_module_strict && !m.parameters.empty()) {
    if (world.size() > 1) {
      at::Tensor on_device = matched.to(world.device());
      world.all_reduce(on_device, ReduceOp::Max);
      matched = on_device.cpu();
    }
    std::string unexpected;
    int count = 0;
    for (size_t i = 0; i < m.parameters.size(); ++i)
      if (matched[i].item<int>() == 0 && count++ < 5) unexpected += (unexpected.empty() ? "" : ", ") + m.parameters[i].name;
    if (count)
      throw std::runtime_error("tessera: checkpoint " + path + " holds " + std::to_string(count) +
                               " parameter(s) the model does not have (" + unexpected + (count > 5 ? ", ..." : "") +
                               "); nothing was loaded (load_module_strict=False ignores them)");
  }

  // 3. Every rank read everything: now the engine takes the values.
  made.taken = true;
  s.zero.wait_for_host_readers();
  for (Copy& c : copies) c.from.defined() ? (void)c.into.copy_(c.from) : (void)c.into.zero_();
  for (auto& [group, arrays] : rs.offloaded) s.zero.write_checkpoint_state(group, arrays);  // NVMe: back to the files
  s.zero.after_shards_loaded();
  if (!o.load_module_only) {
    s.steps = steps;
    if (scaler_state) dynamic_cast<DynamicLossScaler&>(s.scaler).load_state(*scaler_state);
    set_rng_states(s.parallel.device(), rng);
  }
  if (printer) {
    std::sort(notes.begin(), notes.end());
    notes.erase(std::unique(notes.begin(), notes.end()), notes.end());
    std::printf("[tessera] loaded checkpoint %s (%s) at step %lld%s\n", path.c_str(), m.layout.str().c_str(),
                (long long)s.steps.global_step, notes.empty() ? "" : ":");
    for (const std::string& n : notes) std::printf("[tessera]   %s\n", n.c_str());
    std::fflush(stdout);
  }
  return {path, m.client_state.dump()};
}

}  // namespace tessera
