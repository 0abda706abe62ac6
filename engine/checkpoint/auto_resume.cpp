// Engine::auto_resume (engine_checkpoint.h): checkpoint.auto_resume, the load a restarted job
// (engine/launch/restarts.h) does by itself at construction, or the clear error when there is
// nothing to resume from and the config did not ask to start fresh.
#include <ATen/ops/full.h>

#include <unistd.h>

#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>

#include "engine/checkpoint/engine_checkpoint.h"
#include "engine/config/config.h"
#include "engine/engine.h"
#include "parallel/parallel_context.h"

namespace tessera {

// checkpoint.auto_resume (a restarted job resumes by itself, engine/launch/restarts.h): every rank
// looks for `latest` in the load directory and they agree before anyone loads, so a directory that
// only some ranks see is an error rather than a hang.
std::optional<LoadResult> Engine::auto_resume() {
  const CheckpointConfig& c = config_.checkpoint;
  if (!c.auto_resume) return std::nullopt;
  const std::string dir = c.load_dir.empty() ? c.save_dir : c.load_dir;
  const std::string latest = dir + "/latest";
  Communicator& world = parallel_.world();
  at::Tensor seen = at::full({1}, ::access(latest.c_str(), R_OK) == 0 ? 1.0 : 0.0, world.options(at::kFloat));
  if (world.size() > 1) world.all_reduce(seen, ReduceOp::Sum);
  const int ranks_seeing = static_cast<int>(seen.item<double>() + 0.5);
  if (ranks_seeing != 0 && ranks_seeing != world.size())
    throw std::runtime_error("tessera: checkpoint.auto_resume: " + latest + " exists on " + std::to_string(ranks_seeing) +
                             " of " + std::to_string(world.size()) + " ranks: the load directory must be one that every "
                             "rank sees (a shared file system)");
  if (ranks_seeing == 0) {
    if (!c.start_fresh_if_missing)
      throw std::runtime_error("tessera: checkpoint.auto_resume: no checkpoint to resume from in " + dir + " (no " + latest +
                               "); set checkpoint.start_fresh_if_missing to true to train from scratch when there is none");
    if (parallel_.rank() == 0) {
      std::printf("[tessera] checkpoint.auto_resume: no checkpoint in %s yet: training starts from scratch\n", dir.c_str());
      std::fflush(stdout);
    }
    return std::nullopt;
  }
  LoadOptions options;
  options.load_dir = dir;
  LoadResult loaded = load_checkpoint(options);
  if (parallel_.rank() == 0) {
    std::printf("[tessera] checkpoint.auto_resume: resumed from %s at step %lld\n", loaded.path.c_str(),
                (long long)steps_.global_step);
    std::fflush(stdout);
  }
  return loaded;
}

}  // namespace tessera
