// The engine's save and load (DeepSpeed's engine.save_checkpoint / load_checkpoint): every rank
// writes its own part of the training state into one safetensors file, global rank 0 adds
// metadata.json (engine/checkpoint/metadata.h) and commits the directory (checkpoint_dir.h).
//
//   saved per rank   the fp32 values and optimizer state of the shard it owns (at ZeRO stage 0 the
//                    data-parallel replicas are identical: data rank 0 writes them), the model's own
//                    dtype under mixed precision, the 1-bit family's compression errors, and its
//                    torch RNG states (CPU and its device)
//   in the metadata  every parameter's shards as element ranges with checksums, the layout, the
//                    step counters, the loss scaler, the schedule, the caller's client_state (JSON)
//
// Loading reads, on every rank, the elements its shard owns NOW from whichever files hold them, so a
// checkpoint loads at another data-parallel, tensor-parallel or pipeline degree and ZeRO stage
// without a conversion step (reshard.h). Every value is read and checked (checksum, size,
// shape) before anything is changed, and the ranks agree on success first: a bad file leaves the
// engine as it was, on every rank, with an error naming the file and the parameter.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/checkpoint/background_save.h"

namespace tessera {

class ZeroOptimizer;
class LossScaler;
class ParallelContext;
struct Config;

// The engine's counters, as a checkpoint saves and restores them.
struct StepCounters {
  int64_t global_step = 0, micro_step = 0, skipped_steps = 0;
  // The applied step at which the optimizer's own count (Adam's t) and the schedule's start: 0,
  // unless a load without optimizer or scheduler state started them afresh at a later step.
  int64_t optimizer_step_base = 0, schedule_step_base = 0;
  int64_t applied() const { return global_step - skipped_steps; }  // optimizer steps not skipped
  int64_t optimizer_step() const { return applied() - optimizer_step_base; }
  int64_t schedule_step() const { return applied() - schedule_step_base; }
};

// What the engine hands its checkpoints, by reference.
struct TrainingState {
  ZeroOptimizer& zero;
  LossScaler& scaler;
  ParallelContext& parallel;
  const Config& config;
  StepCounters& steps;
  std::string lr_schedule;  // its name, recorded
};

struct SaveOptions {
  std::string save_dir;
  std::string tag;                  // empty: "global_step<N>"
  std::string client_state = "{}";  // JSON text (an object), returned by the load
  std::string hf_config;            // JSON text: a transformers model's config (Metadata::hf_config), or empty
  std::string crash_at;             // tests: SIGKILL at this point of the save (engine/environment.h)
  int write_delay_ms = 0;           // tests: the file writes start this late (engine/environment.h)
  // checkpoint.async_save: the tensors copied to host memory, the files written and committed by a
  // thread (background_save.h) while training goes on.
  bool async = false;
};

struct SaveResult {
  std::string path;                                 // the checkpoint's directory
  std::unique_ptr<BackgroundSave> pending;  // async: the save still being written
};

// Collective over every rank. Throws, on every rank, when a rank could not write (the previous
// checkpoint and `latest` stay as they were); an asynchronous save's write errors are thrown by
// its pending->wait().
SaveResult save_checkpoint(TrainingState& state, const SaveOptions& options);

// The model's weights in their own dtype, whole, as one safetensors file `save_dir/save_filename`
// written by global rank 0 (a collective; the caller gathers ZeRO-3's parameters first). Names
// are the model's own, so torch's load_state_dict reads it. Returns the file's path.
std::string save_16bit_model(TrainingState& state, const std::string& save_dir, const std::string& save_filename);

struct LoadOptions {
  std::string load_dir;
  std::string tag;  // empty: the one `latest` names
  bool load_optimizer_states = true;
  bool load_lr_scheduler_states = true;
  bool load_module_only = false;    // the weights alone: no optimizer, schedule, counters or RNG
  bool load_module_strict = true;   // every parameter of the model in the checkpoint, and no other
  bool load_from_fp32_weights = true;  // false: the master weights from the saved 16-bit ones
};

struct LoadResult {
  std::string path;
  std::string client_state;  // JSON text
};

// Collective over every rank.
LoadResult load_checkpoint(TrainingState& state, const LoadOptions& options);

}  // namespace tessera
