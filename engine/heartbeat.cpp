// The rank's side of the launcher's hang detection and restarts (engine/heartbeat.h).
#include "engine/heartbeat.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

namespace tessera {

Heartbeat::Heartbeat() {
  if (const char* path = std::getenv("TESSERA_HEARTBEAT_FILE")) path_ = path;
  if (const char* count = std::getenv("TESSERA_RESTART_COUNT")) restart_count_ = std::atoi(count);
  if (const char* reason = std::getenv("TESSERA_RESTART_REASON")) restart_reason_ = reason;
}

Heartbeat::~Heartbeat() {
  if (fd_ >= 0) ::close(fd_);
}

void Heartbeat::beat() {
  if (path_.empty()) return;
  if (fd_ < 0) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd_ < 0) {  // the launcher's directory is gone: nothing watches any more
      path_.clear();
      return;
    }
  }
  ::futimens(fd_, nullptr);  // both times to now
}

}  // namespace tessera
