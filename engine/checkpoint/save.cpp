// Engine save (engine_checkpoint.h): each rank writes its file into the partial directory, the
// ranks exchange what they wrote (names, ranges, checksums), and global rank 0 writes
// metadata.json and commits.
#include <algorithm>
#include <chrono>
#include <thread>
#include <cstdio>
#include <map>
#include <optional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <sys/stat.h>

#include "engine/checkpoint/background_save.h"
#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/checkpoint/engine_checkpoint.h"
#include "engine/checkpoint/metadata.h"
#include "engine/checkpoint/rank_file.h"
#include "engine/checkpoint/rank_state.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/config/config.h"
#include "optim/loss_scaler.h"
#include "parallel/parallel_context.h"
#include "zero/zero_optimizer.h"

namespace tessera {

using nlohmann::json;
using namespace checkpoint;

namespace {

json loss_scaler_json(const LossScaler& scaler) {
  if (const auto* dynamic = dynamic_cast<const DynamicLossScaler*>(&scaler)) {
    const DynamicLossScaler::State& s = dynamic->state();
    return {{"type", "dynamic"}, {"scale", s.scale}, {"cur_iter", s.cur_iter},
            {"last_overflow_iter", s.last_overflow_iter}, {"cur_hysteresis", s.cur_hysteresis}};
  }
  return {{"type", scaler.dynamic() ? "dynamic" : (scaler.scale() == 1.0 ? "none" : "static")}, {"scale", scaler.scale()}};
}

// On the host and contiguous: what is written is what is hashed. A snapshot (an asynchronous save,
// `rank`'s file at `path`) copies every tensor into the file's image whatever its device, since
// training goes on changing the engine's buffers; otherwise host tensors are written from where
// they are.
RankFile collect_rank_file(const RankState& rs, const c10::Device& device, bool snapshot, int rank, const std::string& path) {
  RankFile f;
  for (size_t i = 0; i < rs.pieces.size(); ++i) {
    if (!rs.writes_piece[i]) continue;
    const PieceView& p = rs.pieces[i];
    for (const auto& [state, t] : p.states) f.tensors.emplace_back(state + "/" + p.name, t);
    if (p.compute.defined()) f.tensors.emplace_back("compute/" + p.name, p.compute);
    for (const auto& [state, t] : p.per_parameter) f.tensors.emplace_back(state + "/" + p.name, t);
    f.add_piece(p.name, p.shape, safetensors_dtype(p.dtype), rs.pipeline_stage, p.tensor_rank, p.split, p.begin, p.numel);
  }
  for (size_t i = 0; i < rs.groups.size(); ++i) {
    const GroupView& g = rs.groups[i];
    for (const auto& [state, t] : g.rank_local) f.tensors.emplace_back("local/" + g.first_parameter + "/" + state, t);
    if (!rs.writes_group[i] || g.group_states.empty()) continue;
    std::vector<std::string> states;
    for (const auto& [state, t] : g.group_states) {
      f.tensors.emplace_back("group/" + g.first_parameter + "/" + state, t);
      states.push_back(state);
    }
    f.groups.push_back({{"first_parameter", g.first_parameter}, {"pipeline_stage", rs.pipeline_stage},
                        {"tensor_rank", g.tensor_rank}, {"states", states}});
  }
  for (auto& e : rng_states(device)) f.tensors.push_back(std::move(e));
  if (snapshot) f.snapshot(rank, path);
  else
    for (auto& [name, t] : f.tensors) t = t.detach().to(at::kCPU).contiguous();
  return f;
}

// The part of a save after the snapshot: this rank's file written, the entries exchanged over
// `comm`, and rank 0's metadata and commit. Run in the call, or by a BackgroundSave's thread.
struct SaveJob {
  RankFile file;
  std::string tag, path, file_name, crash_at;
  int rank = 0, delay_ms = 0;
  std::unique_ptr<CheckpointWriter> writer;  // rank 0's
  Metadata base;                             // rank 0's: the layout and counters at the save

  void run(Communicator& comm) {
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    std::string error, entry;
    try {
      entry = write_rank_file(file, path, file_name, rank).dump();
    } catch (const std::exception& e) {
      error = e.what();
    }
    file.tensors.clear(), file.image.reset();  // a snapshot's memory goes once it is written
    crash_point(crash_at, "after_shard_write");
    std::vector<std::string> entries = all_gather_strings(comm, error.empty() ? entry : "");
    agree(comm, error, "writing checkpoint " + tag);
    if (rank == 0) {
      try {
        const Metadata m = merge(entries, std::move(base));
        write_file_durably(writer->file(kMetadataFile), m.to_json().dump(1));
        writer->commit();
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    agree(comm, error, "committing checkpoint " + tag);
  }
};

}  // namespace

SaveResult save_checkpoint(TrainingState& s, const SaveOptions& options) {
  Communicator& world = s.parallel.world();
  const int64_t gas = *s.config.gradient_accumulation_steps;
  if (s.steps.micro_step % gas != 0)
    throw std::invalid_argument("tessera: save_checkpoint at micro-step " + std::to_string(s.steps.micro_step) +
                                ", inside a gradient accumulation window of " + std::to_string(gas) +
                                ": the gradients accumulated so far are not saved; save after the step() that ends the window");
  const std::string tag = options.tag.empty() ? "global_step" + std::to_string(s.steps.global_step) : options.tag;
  check_tag(tag);
  // Errors from here on are agreed on by every rank (a rank alone throwing would leave the others
  // waiting in the next collective).
  std::string error;
  json client_state = json::parse(options.client_state, nullptr, false);
  if (client_state.is_discarded() || !client_state.is_object())
    error = "tessera: save_checkpoint: client_state must be a JSON object";
  // checkpoint.tag_validation: every rank saves under the same tag.
  const std::string& validation = s.config.checkpoint.tag_validation;
  if (validation != "Ignore") {
    for (const std::string& other : all_gather_strings(world, tag))
      if (other != tag) {
        const std::string message = "tessera: checkpoint tag \"" + tag + "\" differs across ranks (another rank saves \"" +
                                    other + "\") [checkpoint.tag_validation]";
        if (validation == "Fail") throw std::invalid_argument(message);
        if (s.parallel.rank() == 0) std::printf("[tessera] warning: %s\n", message.c_str());
        break;
      }
  }
  s.zero.wait_for_parameters();
  auto job = std::make_shared<SaveJob>();
  job->tag = tag;
  job->rank = s.parallel.rank();
  job->file_name = rank_file_name(job->rank);
  job->path = partial_dir_of(options.save_dir, tag) + "/" + job->file_name;
  job->crash_at = options.crash_at;
  job->delay_ms = options.write_delay_ms;

  // 1. Rank 0 makes the partial directory.
  if (job->rank == 0 && error.empty()) {
    try {
      job->writer = std::make_unique<CheckpointWriter>(options.save_dir, tag, options.crash_at);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree(world, error, "creating checkpoint " + tag);
  // 2. This rank's part on the host (a copy when the save goes on in the background).
  try {
    // NVMe parameter offload: the shards in memory while the rank's view reads them.
    ZeroOptimizer::ResidentParameters resident(s.zero, /*modifies=*/false);
    const RankState rs = rank_state(s.zero, s.parallel);
    job->file = collect_rank_file(rs, s.parallel.device(), options.async, job->rank, job->path);
    if (job->rank == 0) {
      job->base.tag = tag;
      job->base.layout = current_layout(s, rs.shard_states);
      job->base.engine = {{"global_step", s.steps.global_step},
                          {"micro_step", s.steps.micro_step},
                          {"skipped_steps", s.steps.skipped_steps},
                          {"optimizer_step_base", s.steps.optimizer_step_base},
                          {"schedule_step_base", s.steps.schedule_step_base},
                          {"loss_scaler", loss_scaler_json(s.scaler)},
                          {"lr_scheduler", s.lr_schedule}};
      job->base.client_state = client_state;
      if (!options.hf_config.empty()) job->base.hf_config = json::parse(options.hf_config);
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree(world, error, "writing checkpoint " + tag);
  // 3. The files and the commit: here, or by a thread over a communicator of its own.
  SaveResult result{options.save_dir + "/" + tag, nullptr};
  if (!options.async) {
    job->run(world);
    return result;
  }
  Communicator& own = s.parallel.group_over("world", "checkpoint");  // every rank asks together, here
  const int64_t bytes = job->file.bytes();
  result.pending = std::make_unique<BackgroundSave>(result.path, bytes, [job, &own] { job->run(own); });
  return result;
}

std::string save_16bit_model(TrainingState& s, const std::string& save_dir, const std::string& save_filename) {
  const GridShape& grid = s.parallel.grid();
  if (grid.tensor > 1 || grid.pipe > 1)
    throw std::invalid_argument("tessera: save_16bit_model needs the whole model on one rank; with " + grid.str() +
                                " save a checkpoint and run `tessera checkpoint export` on it");
  const std::string suffix = ".safetensors";
  if (save_filename.size() <= suffix.size() || save_filename.compare(save_filename.size() - suffix.size(), suffix.size(), suffix) != 0 ||
      save_filename.find('/') != std::string::npos)
    throw std::invalid_argument("tessera: save_16bit_model writes safetensors (no pickle): save_filename \"" + save_filename +
                                "\" must be a file name ending in .safetensors");
  s.zero.wait_for_parameters();
  const std::string path = save_dir + "/" + save_filename;
  std::string error;
  if (s.parallel.rank() == 0) {
    try {
      NamedTensors tensors;
      for (const auto& g : s.zero.groups())
        for (size_t i = 0; i < g->params.size(); ++i) tensors.emplace_back(g->names[i], g->params[i].detach());
      std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      for (size_t i = 1; i < tensors.size(); ++i)
        if (tensors[i].first == tensors[i - 1].first)
          throw std::invalid_argument("tessera: save_16bit_model: two parameters are named " + tensors[i].first);
      ::mkdir(save_dir.c_str(), 0755);
      write_safetensors_replacing(path, tensors, {{"format", "pt"}});
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree(s.parallel.world(), error, "save_16bit_model");
  return path;
}

}  // namespace tessera
