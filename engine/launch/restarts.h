// Restarting a job after a failure (torchrun's --max-restarts; LaunchConfig::max_restarts and
// hang_timeout_s): the supervisor stops every rank when one fails or hangs (engine/launch/
// supervisor.h), and the launcher starts them all again, up to max_restarts times. Each restarted
// rank learns which attempt it is and why the last one ended (engine/heartbeat.h); a job that
// saves checkpoints and sets checkpoint.auto_resume resumes from its latest one (docs/launcher.md).
#pragma once

#include <functional>
#include <map>
#include <string>

#include "engine/launch/supervisor.h"

namespace tessera {

// Runs attempt(count, reason) for count 0, 1, ... (reason: how the attempt before ended; "" for the
// first) until one succeeds, the supervisor was interrupted (a person's Ctrl-C is not a failure to
// recover from), one ends `final` (it could not start: too few hosts left), or max_restarts
// restarts have been made. Returns the last attempt's status.
int run_with_restarts(int max_restarts, const std::function<JobEnd(int count, const std::string& reason)>& attempt);

// The variables a restarted attempt's ranks get: TESSERA_RESTART_COUNT and torchrun's
// TORCHELASTIC_RESTART_COUNT, TESSERA_RESTART_REASON; TORCHELASTIC_MAX_RESTARTS always.
std::map<std::string, std::string> restart_environment(int max_restarts, int count, const std::string& reason);

// A directory of its own for the ranks' heartbeat files, under $TMPDIR (or /tmp); removed with its
// files on destruction. Empty (no directory made) when `wanted` is false.
class HeartbeatDirectory {
 public:
  explicit HeartbeatDirectory(bool wanted);
  ~HeartbeatDirectory();
  HeartbeatDirectory(const HeartbeatDirectory&) = delete;
  HeartbeatDirectory& operator=(const HeartbeatDirectory&) = delete;
  // Rank `rank`'s file for attempt `count` ("" without a directory); an earlier attempt's is removed.
  std::string file_for(int rank, int count);

 private:
  std::string path_;
};

}  // namespace tessera
