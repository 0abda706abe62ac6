// What a rank of a supervised job shares with its launcher (engine/launch/restarts.h): the
// launcher's hang detection watches a file that the engine touches after every optimizer step
// (TESSERA_HEARTBEAT_FILE; created at the first step, so a job still starting is not a hang), and a
// restarted job's ranks learn which attempt they are and why the last one ended
// (TESSERA_RESTART_COUNT and TESSERA_RESTART_REASON; torchrun's TORCHELASTIC_RESTART_COUNT too).
#pragma once

#include <string>

namespace tessera {

class Heartbeat {
 public:
  // From this process's environment; without the variables every call below does nothing.
  Heartbeat();
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // After an optimizer step: the file's modification time becomes now (one system call).
  void beat();
  int restart_count() const { return restart_count_; }
  const std::string& restart_reason() const { return restart_reason_; }

 private:
  std::string path_;
  int fd_ = -1;
  int restart_count_ = 0;
  std::string restart_reason_;
};

}  // namespace tessera
