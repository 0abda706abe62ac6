// Restarting a job after a failure (engine/launch/restarts.h).
#include "engine/launch/restarts.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <vector>

namespace tessera {

int run_with_restarts(int max_restarts, const std::function<JobEnd(int count, const std::string& reason)>& attempt) {
  std::string reason;
  for (int count = 0;; ++count) {
    const JobEnd end = attempt(count, reason);
    if (end.status == 0 || end.interrupted || end.final) return end.status;
    if (count == max_restarts) {
      if (max_restarts > 0)
        std::fprintf(stderr, "tessera launch: the restart limit (max_restarts %d) is reached: the job ends with "
                             "status %d\n", max_restarts, end.status);
      return end.status;
    }
    reason = end.reason;
    std::fprintf(stderr, "tessera launch: restart %d of %d: every rank starts again (%s)\n", count + 1, max_restarts,
                 reason.c_str());
  }
}

std::map<std::string, std::string> restart_environment(int max_restarts, int count, const std::string& reason) {
  std::map<std::string, std::string> env{{"TORCHELASTIC_MAX_RESTARTS", std::to_string(max_restarts)}};
  if (count == 0) return env;
  env["TESSERA_RESTART_COUNT"] = env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(count);
  env["TESSERA_RESTART_REASON"] = reason;
  return env;
}

HeartbeatDirectory::HeartbeatDirectory(bool wanted) {
  if (!wanted) return;
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/tessera-heartbeat-XXXXXX";
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  if (!::mkdtemp(name.data()))
    throw std::runtime_error("tessera launch: cannot create a directory for the heartbeat files (hang_timeout_s) "
                             "under " + pattern.substr(0, pattern.rfind('/')));
  path_ = name.data();
}

HeartbeatDirectory::~HeartbeatDirectory() {
  if (path_.empty()) return;
  if (DIR* dir = ::opendir(path_.c_str())) {
    while (dirent* entry = ::readdir(dir))
      if (entry->d_name[0] != '.') ::unlink((path_ + "/" + entry->d_name).c_str());
    ::closedir(dir);
  }
  ::rmdir(path_.c_str());
}

std::string HeartbeatDirectory::file_for(int rank, int count) {
  if (path_.empty()) return "";
  if (count > 0) ::unlink((path_ + "/rank" + std::to_string(rank) + "." + std::to_string(count - 1)).c_str());
  return path_ + "/rank" + std::to_string(rank) + "." + std::to_string(count);
}

}  // namespace tessera
