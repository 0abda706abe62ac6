// Runs a set of processes as one job and watches them: the first to fail stops the others
// (SIGTERM, then SIGKILL after a grace period), a signal to the supervisor is forwarded to all of
// them, and one line says how the job ended. `tessera launch` uses it for a node's ranks
// (engine/launch/launcher.h) and, with a hostfile, for the connections to every host
// (engine/launch/hosts_launch.h).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace tessera {

struct SupervisedProcess {
  std::string name;               // how the report names it: "rank 3 (local rank 1)", "host node2 (node 1)"
  std::vector<std::string> argv;  // the program (looked up in the PATH of `env`) and its arguments
  std::vector<std::string> env;   // its whole environment, "NAME=value"
  // Set: its stdout and stderr are copied to ours a whole line at a time, each prefixed with this.
  std::optional<std::string> output_prefix;
  bool stdin_null = false;        // read stdin from /dev/null instead of ours
  // Its children leave its process group (pdsh starts each ssh in a session of its own): a stop
  // signals each of them too, or they would outlive it and keep their hosts' ranks running.
  bool children_leave_group = false;
  // With output_prefix: called with each line it writes to stderr; returning true marks it failed
  // with `status` and `how`, as if it had exited so (pdsh reports a host's failure this way).
  std::function<bool(const std::string& line, int& status, std::string& how)> failure_in_output;
  // Set, with SupervisorOptions::hang_timeout_s: a file the process touches as it makes progress
  // (engine/heartbeat.h). Once it exists, a modification time older than the timeout is a hang.
  std::string heartbeat_file;
};

struct SupervisorOptions {
  double grace_period_s = 5;  // after a failure or a signal: SIGTERM, wait this long, then SIGKILL
  std::string noun = "rank";  // what the processes are, in the report: "stopped the other 3 rank(s)"
  double hang_timeout_s = 0;  // > 0: a heartbeat file this much older than now fails its process
};

// The status a hung process fails with (as timeout(1) exits).
constexpr int kHangStatus = 124;

// How a supervised job ended: its status (below), whether the supervisor was interrupted, and the
// report's line ("rank 1 (local rank 1) was killed by signal 9 (Killed); stopped the other 1
// rank(s)"; empty after a success).
struct JobEnd {
  int status = 0;
  bool interrupted = false;
  std::string reason;
  bool final = false;  // set by a caller that could not start the job again (engine/launch/restarts.h)
};

// Starts `processes` in order and waits for all of them. Returns 0 when every one exits 0; else
// the first failing one's status (its exit code, or 128 + signal when a signal killed it, or
// kHangStatus for a hang); 128 + signal when the supervisor itself was interrupted (SIGINT,
// SIGTERM, SIGHUP and SIGQUIT are forwarded). Installs its own signal handlers while it runs
// (restored on return): one at a time.
int supervise(std::vector<SupervisedProcess> processes, const SupervisorOptions& options);
JobEnd supervise_job(std::vector<SupervisedProcess> processes, const SupervisorOptions& options);

// "2.5" for 2.5, "300" for 300: seconds as a person writes them.
std::string format_seconds(double s);

}  // namespace tessera
