// The launcher: start the ranks, watch them, stop them all when one fails (engine/launch/launcher.h).
//
// It is one thread running one poll() loop. What it waits on:
//   - a self-pipe that the signal handlers write a byte to. SIGCHLD means "a rank may have exited";
//     SIGINT, SIGTERM, SIGHUP and SIGQUIT mean "stop the job". The handlers only count and write
//     the byte; all the work happens in the loop. A signal that arrives anywhere before poll()
//     leaves its byte in the pipe, so poll() returns at once: no wake-up can be lost.
//   - with tag_output, the read ends of every rank's stdout and stderr pipes.
//   - with a stop under way, the deadline of the grace period (poll's timeout).
//
// Each rank leads its own process group (group id = its pid), so one killpg() reaches everything
// the rank started (a shell's children, data-loader workers). Exits are observed with
// waitid(WNOWAIT) and reaped only at the very end: a zombie keeps its pid, and so its group id,
// from being reused, so signalling a rank's group can never hit an unrelated process.
#include "engine/launch/launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <stdexcept>

extern char** environ;

namespace tessera {

namespace {

using Clock = std::chrono::steady_clock;

// ---- output ----------------------------------------------------------------------------------

void write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n > 0) {
      data += n, size -= size_t(n);
    } else if (n < 0 && errno == EAGAIN) {  // our stdout may have been left non-blocking
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, -1);
    } else if (!(n < 0 && errno == EINTR)) {
      return;  // the reader went away (EPIPE): nothing useful to do with the output
    }
  }
}

void write_all(int fd, const std::string& s) { write_all(fd, s.data(), s.size()); }

void say(const std::string& line) { write_all(STDERR_FILENO, "tessera launch: " + line + "\n"); }

// Copies one of a rank's output pipes to the launcher's stdout or stderr, a whole line at a time,
// each prefixed with "[rankN]: ": lines of different ranks interleave, but never mix.
class TaggedPipe {
 public:
  void open(int read_fd, int target_fd, std::string prefix) {
    fd_ = read_fd, target_ = target_fd, prefix_ = std::move(prefix);
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);  // the loop must never block on a rank
  }
  int fd() const { return fd_; }

  // Reads what is there; at end of file, writes the unfinished last line and closes.
  // Returns the bytes read (0 when nothing was available or the pipe closed).
  size_t pump() {
    char buffer[65536];
    ssize_t n = ::read(fd_, buffer, sizeof buffer);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
    if (n <= 0) {
      close();
      return 0;
    }
    partial_.append(buffer, size_t(n));
    std::string lines;
    size_t start = 0;
    for (size_t end; (end = partial_.find('\n', start)) != std::string::npos; start = end + 1)
      lines += prefix_ + partial_.substr(start, end + 1 - start);
    partial_.erase(0, start);
    // A rank printing without newlines must not make the launcher hoard its output.
    if (partial_.size() > sizeof buffer) lines += prefix_ + partial_ + "\n", partial_.clear();
    write_all(target_, lines);
    return size_t(n);
  }

  // After the rank has exited: copies what is left in the pipe. Bounded, because a process the
  // rank left behind may still hold the pipe open and keep writing.
  void finish() {
    for (size_t total = 0; fd_ >= 0 && total < (size_t(1) << 20);) {
      size_t n = pump();
      if (n == 0) break;
      total += n;
    }
    close();
  }

 private:
  void close() {
    if (fd_ < 0) return;
    if (!partial_.empty()) write_all(target_, prefix_ + partial_ + "\n");
    partial_.clear();
    ::close(fd_);
    fd_ = -1;
  }

  int fd_ = -1;
  int target_ = -1;
  std::string prefix_;
  std::string partial_;
};

// ---- signals ---------------------------------------------------------------------------------

int g_wake_pipe[2] = {-1, -1};
volatile sig_atomic_t g_interrupts = 0;        // SIGINT/TERM/HUP/QUIT received so far
volatile sig_atomic_t g_first_interrupt = 0;   // the first of them: the exit status is 128 + it

extern "C" void on_signal(int sig) {
  int saved_errno = errno;
  if (sig != SIGCHLD) {
    if (g_first_interrupt == 0) g_first_interrupt = sig;
    g_interrupts = g_interrupts + 1;
  }
  char byte = 0;
  (void)!::write(g_wake_pipe[1], &byte, 1);  // non-blocking: a full pipe already means "wake up"
  errno = saved_errno;
}

constexpr int kWatchedSignals[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT};
constexpr int kWatchedCount = sizeof kWatchedSignals / sizeof kWatchedSignals[0];

// Installs the handlers and the self-pipe for the lifetime of one launch; restores what was there.
class SignalWatch {
 public:
  SignalWatch() {
    if (::pipe2(g_wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) throw std::runtime_error("tessera launch: pipe failed");
    g_interrupts = 0, g_first_interrupt = 0;
    struct sigaction action {};
    action.sa_handler = on_signal;
    action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigemptyset(&action.sa_mask);
    for (int i = 0; i < kWatchedCount; ++i) {
      int sig = kWatchedSignals[i];
      ::sigaction(sig, nullptr, &previous_[i]);
      // A signal the launcher was started with ignored (nohup, `cmd &` in a script) stays ignored,
      // for the ranks too, as shells do.
      installed_[i] = sig == SIGCHLD || previous_[i].sa_handler != SIG_IGN;
      if (installed_[i]) ::sigaction(sig, &action, nullptr);
    }
  }
  ~SignalWatch() {
    for (int i = 0; i < kWatchedCount; ++i)
      if (installed_[i]) ::sigaction(kWatchedSignals[i], &previous_[i], nullptr);
    ::close(g_wake_pipe[0]);
    ::close(g_wake_pipe[1]);
    g_wake_pipe[0] = g_wake_pipe[1] = -1;
  }
  SignalWatch(const SignalWatch&) = delete;
  SignalWatch& operator=(const SignalWatch&) = delete;

  int fd() const { return g_wake_pipe[0]; }
  void drain() const {
    char buffer[256];
    while (::read(g_wake_pipe[0], buffer, sizeof buffer) > 0) {
    }
  }
  // In a freshly forked rank, before exec: our handlers must not run there (they would write to
  // the launcher's pipe). Only async-signal-safe calls.
  void reset_in_child() const {
    struct sigaction fallback {};
    fallback.sa_handler = SIG_DFL;
    sigemptyset(&fallback.sa_mask);
    for (int i = 0; i < kWatchedCount; ++i)
      if (installed_[i]) ::sigaction(kWatchedSignals[i], &fallback, nullptr);
  }

 private:
  struct sigaction previous_[kWatchedCount] {};
  bool installed_[kWatchedCount] = {};
};

std::string signal_name(int sig) {
  const char* name = ::strsignal(sig);
  return "signal " + std::to_string(sig) + (name ? std::string(" (") + name + ")" : "");
}

std::string format_seconds(double s) {
  char text[64];
  std::snprintf(text, sizeof text, "%.6f", s);
  std::string out = text;
  out.erase(out.find_last_not_of('0') + 1);
  if (out.back() == '.') out.pop_back();
  return out;
}

// ---- the job ---------------------------------------------------------------------------------

struct Rank {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;          // also its process-group id; -1 while not started
  bool exited = false;     // exit observed (still a zombie until reaped at the end)
  int status = 0;          // as a shell reports it: the exit code, or 128 + signal
  std::string how;         // "exited with status 7", "was killed by signal 9 (Killed)"
  std::string start_error; // set when exec failed: reported instead of the 126/127 exit
  TaggedPipe out, err;
};

class Job {
 public:
  Job(const LaunchConfig& config, const std::vector<std::string>& command)
      : config_(config), command_(command), ranks_(size_t(config.nproc_per_node)) {
    for (int i = 0; i < config.nproc_per_node; ++i) {
      ranks_[i].local_rank = i;
      ranks_[i].rank = config.node_rank * config.nproc_per_node + i;
    }
  }

  int run() {
    start_ranks();
    while (true) {
      collect_exits();
      handle_interrupts();
      if (all_exited()) break;
      wait_for_events();
      if (stopping_ && !killed_ && Clock::now() >= kill_deadline_)
        kill_survivors("after the " + format_seconds(config_.grace_period_s) + " s grace period");
    }
    for (auto& r : ranks_) r.out.finish(), r.err.finish();
    // Whatever the ranks left running in their groups goes too (the zombies still hold the ids).
    if (stopping_) signal_groups(SIGKILL);
    for (auto& r : ranks_)
      if (r.pid > 0) ::waitpid(r.pid, nullptr, 0);
    return report();
  }

 private:
  // Starts the ranks in order; stops early when one cannot start or the launcher is interrupted.
  void start_ranks() {
    for (auto& r : ranks_) {
      if (g_interrupts > 0) return;
      std::vector<std::string> args = command_;
      if (config_.pass_local_rank)  // where DeepSpeed's launcher puts it: before the script's own arguments
        args.insert(args.begin() + static_cast<std::ptrdiff_t>(script_end(args)),
                    "--local_rank=" + std::to_string(r.local_rank));
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      std::string error = start_rank(r, argv);
      if (error.empty()) continue;
      if (r.pid > 0) {
        r.start_error = error;  // its exit (126 or 127) becomes the failure the loop reports
      } else {
        r.exited = true, r.status = 1, r.how = error;
        on_failure(r);
      }
      return;
    }
  }

  // Where a program's own arguments begin: after `python [options] script.py` (or `-m module`),
  // else right after the program.
  static size_t script_end(const std::vector<std::string>& args) {
    const std::string program = args[0].substr(args[0].rfind('/') + 1);
    if (program.rfind("python", 0) != 0) return 1;
    for (size_t i = 1; i < args.size(); ++i) {
      const std::string& a = args[i];
      if (a == "-m" || a == "-c") return std::min(i + 2, args.size());
      if (a == "-X" || a == "-W") ++i;  // an option with its value
      else if (a.empty() || a[0] != '-') return i + 1;  // the script
    }
    return args.size();
  }

  // Forks and execs one rank. Returns "" or why the rank could not start; when exec failed, the
  // child exists (r.pid is set) and has exited 127 or 126, as a shell would.
  std::string start_rank(Rank& r, std::vector<char*>& argv) {
    std::vector<std::string> env = rank_environment(config_, r.local_rank);
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);

    // exec_status is closed by a successful exec (O_CLOEXEC) and carries errno when exec fails.
    int out[2] = {-1, -1}, err[2] = {-1, -1}, exec_status[2] = {-1, -1};
    auto close_all = [&](std::initializer_list<int> fds) {
      for (int fd : fds)
        if (fd >= 0) ::close(fd);
    };
    if ((config_.tag_output && (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)) ||
        ::pipe2(exec_status, O_CLOEXEC) != 0) {
      int e = errno;
      close_all({out[0], out[1], err[0], err[1], exec_status[0], exec_status[1]});
      return std::string("could not be started: cannot create a pipe: ") + std::strerror(e);
    }

    // No handler may run in the child between fork and exec: block everything across fork.
    sigset_t all, previous_mask;
    sigfillset(&all);
    ::sigprocmask(SIG_SETMASK, &all, &previous_mask);
    pid_t launcher = ::getpid();
    pid_t pid = ::fork();
    if (pid == 0) {
      // The child: only async-signal-safe calls until exec.
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);       // the launcher SIGKILLed: the rank goes too
      if (::getppid() != launcher) ::_exit(127);  // ... and it may have gone before prctl
      signals_.reset_in_child();
      ::sigprocmask(SIG_SETMASK, &previous_mask, nullptr);
      if (config_.tag_output) ::dup2(out[1], STDOUT_FILENO), ::dup2(err[1], STDERR_FILENO);
      environ = envp.data();  // execvp searches the rank's PATH
      ::execvp(argv[0], argv.data());
      int e = errno;
      (void)!::write(exec_status[1], &e, sizeof e);
      ::_exit(e == ENOENT ? 127 : 126);
    }
    int fork_errno = errno;
    ::sigprocmask(SIG_SETMASK, &previous_mask, nullptr);
    close_all({out[1], err[1], exec_status[1]});  // the child's ends
    if (pid < 0) {
      close_all({out[0], err[0], exec_status[0]});
      return std::string("could not be started: fork failed: ") + std::strerror(fork_errno);
    }
    // Also here, not only in the child: the group must exist before we might signal it.
    ::setpgid(pid, pid);
    r.pid = pid;
    if (config_.tag_output) {
      std::string prefix = "[rank" + std::to_string(r.rank) + "]: ";
      r.out.open(out[0], STDOUT_FILENO, prefix);
      r.err.open(err[0], STDERR_FILENO, prefix);
    }
    int exec_errno = 0;
    ssize_t n;
    do n = ::read(exec_status[0], &exec_errno, sizeof exec_errno);
    while (n < 0 && errno == EINTR);
    ::close(exec_status[0]);
    if (n == sizeof exec_errno) return "could not run '" + command_[0] + "': " + std::strerror(exec_errno);
    return "";
  }

  bool all_exited() const {
    for (const auto& r : ranks_)
      if (r.pid > 0 && !r.exited) return false;
    return true;
  }

  int running() const {
    int n = 0;
    for (const auto& r : ranks_) n += r.pid > 0 && !r.exited;
    return n;
  }

  void wait_for_events() {
    std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}};
    std::vector<TaggedPipe*> pipes;
    for (auto& r : ranks_)
      for (TaggedPipe* p : {&r.out, &r.err})
        if (p->fd() >= 0) fds.push_back({p->fd(), POLLIN, 0}), pipes.push_back(p);
    int timeout_ms = -1;
    if (stopping_ && !killed_) {
      auto left = std::chrono::duration<double, std::milli>(kill_deadline_ - Clock::now()).count();
      timeout_ms = int(std::min(std::max(std::ceil(left), 0.0), 1e9));
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0) return;  // EINTR: the loop looks again
    if (fds[0].revents) signals_.drain();
    for (size_t i = 0; i < pipes.size(); ++i)
      if (fds[i + 1].revents) pipes[i]->pump();
  }

  // Notes which ranks have exited, without reaping them (see the top of this file).
  void collect_exits() {
    for (auto& r : ranks_) {
      if (r.pid <= 0 || r.exited) continue;
      siginfo_t info{};
      int rc = ::waitid(P_PID, id_t(r.pid), &info, WEXITED | WNOHANG | WNOWAIT);
      if (rc != 0 && errno == ECHILD) {  // reaped behind our back (a waitpid(-1) elsewhere in the process)
        r.exited = true, r.status = 1, r.how = "was reaped by someone else: its exit status is lost";
        r.pid = -1;  // its pid may already be reused: never signal it
        on_failure(r);
        continue;
      }
      if (rc != 0 || info.si_pid != r.pid) continue;
      r.exited = true;
      if (info.si_code == CLD_EXITED) {
        r.status = info.si_status;
        r.how = "exited with status " + std::to_string(info.si_status);
      } else {
        r.status = 128 + info.si_status;
        r.how = "was killed by " + signal_name(info.si_status) + (info.si_code == CLD_DUMPED ? ", core dumped" : "");
      }
      if (!r.start_error.empty()) r.how = r.start_error;
      if (r.status != 0) on_failure(r);
    }
  }

  // The first failure stops the job; later exits (most of them caused by the stop) are not failures.
  void on_failure(const Rank& r) {
    if (stopping_) return;
    failed_ = &r;
    begin_stop(SIGTERM);
  }

  void handle_interrupts() {
    for (; interrupts_seen_ < g_interrupts; ++interrupts_seen_) {
      if (!stopping_) {
        interrupted_by_ = g_first_interrupt;
        begin_stop(interrupted_by_);  // forwarded as received: SIGINT stays SIGINT
      } else if (!killed_) {
        kill_survivors("on a second signal");  // asked again while stopping: do not wait out the grace period
      }
    }
  }

  void begin_stop(int sig) {
    stopping_ = true;
    stopped_ = running();
    signal_groups(sig);
    kill_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(config_.grace_period_s));
  }

  void kill_survivors(const std::string& why) {
    killed_ = true;
    killed_why_ = why;
    killed_count_ = running();
    signal_groups(SIGKILL);
  }

  // Every started rank's group, exited ones included: their leftovers must stop too.
  void signal_groups(int sig) {
    for (const auto& r : ranks_)
      if (r.pid > 0) ::killpg(r.pid, sig);  // ESRCH: the group is already empty
  }

  // The one line that says how the job ended, and the launcher's exit status.
  int report() const {
    if (failed_) {
      say("rank " + std::to_string(failed_->rank) + " (local rank " + std::to_string(failed_->local_rank) + ") " +
          failed_->how + stop_summary("; stopped the other "));
      return failed_->status;
    }
    if (interrupted_by_) {
      say("interrupted by " + signal_name(interrupted_by_) + stop_summary("; stopped "));
      return 128 + interrupted_by_;
    }
    return 0;
  }

  std::string stop_summary(const std::string& lead) const {
    if (stopped_ == 0) return "";
    std::string s = lead + std::to_string(stopped_) + " rank(s)";
    if (killed_count_ > 0)
      s += " (" + std::to_string(killed_count_) + " killed " + killed_why_ + ")";
    return s;
  }

  const LaunchConfig& config_;
  const std::vector<std::string>& command_;
  std::vector<Rank> ranks_;
  SignalWatch signals_;  // constructed before any rank is forked: no SIGCHLD can be missed
  bool stopping_ = false;
  bool killed_ = false;
  Clock::time_point kill_deadline_;
  const Rank* failed_ = nullptr;
  int interrupted_by_ = 0;
  sig_atomic_t interrupts_seen_ = 0;
  int stopped_ = 0;       // ranks still running when the stop began
  int killed_count_ = 0;  // ranks still running when SIGKILL was sent
  std::string killed_why_;
};

}  // namespace

std::vector<std::string> rank_environment(const LaunchConfig& c, int local_rank) {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string entry = *e;
    size_t eq = entry.find('=');
    if (eq != std::string::npos) env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  for (const auto& [name, value] : c.env) env[name] = value;

  int rank = c.node_rank * c.nproc_per_node + local_rank;
  env["RANK"] = std::to_string(rank);
  env["WORLD_SIZE"] = std::to_string(c.world_size());
  env["LOCAL_RANK"] = std::to_string(local_rank);
  env["LOCAL_WORLD_SIZE"] = std::to_string(c.nproc_per_node);
  env["GROUP_RANK"] = std::to_string(c.node_rank);
  env["GROUP_WORLD_SIZE"] = std::to_string(c.nnodes);
  env["ROLE_RANK"] = std::to_string(rank);
  env["ROLE_WORLD_SIZE"] = std::to_string(c.world_size());
  env["MASTER_ADDR"] = c.master_addr;
  env["MASTER_PORT"] = std::to_string(c.master_port);
  env["TESSERA_TIMEOUT_S"] = format_seconds(c.timeout_s);
  env["TESSERA_LAUNCHED"] = "1";  // errors then point at tessera launch's flags, not the variables it sets
  // The launcher prefixes every line: Python's tessera then keeps torch.distributed from adding a second "[rankN]: ".
  if (c.tag_output) env["TESSERA_TAG_OUTPUT"] = "1";
  // torchrun's rule: several ranks each using every core would oversubscribe the CPU, so unless
  // told otherwise (the config, or the launcher's own environment) each gets one OpenMP thread.
  if (c.omp_num_threads)
    env["OMP_NUM_THREADS"] = std::to_string(*c.omp_num_threads);
  else if (c.nproc_per_node > 1 && !env.count("OMP_NUM_THREADS"))
    env["OMP_NUM_THREADS"] = "1";

  std::vector<std::string> out;
  for (const auto& [name, value] : env) out.push_back(name + "=" + value);
  return out;
}

int launch(const LaunchConfig& config, const std::vector<std::string>& command) {
  if (command.empty() || command[0].empty()) throw ConfigError("tessera launch: no program to run");
  // Re-checked through the JSON form, so a config built in code gets the same checks as a file.
  ConfigReport report;
  parse_launch_config(launch_config_to_json(config), report);
  if (!report.ok()) throw ConfigError("invalid launch config:\n" + report.errors());
  Job job(config, command);
  return job.run();
}

}  // namespace tessera
