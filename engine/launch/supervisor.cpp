// The supervisor (engine/launch/supervisor.h).
//
// It is one thread running one poll() loop. What it waits on:
//   - a self-pipe that the signal handlers write a byte to. SIGCHLD means "a process may have
//     exited"; SIGINT, SIGTERM, SIGHUP and SIGQUIT mean "stop the job". The handlers only count and
//     write the byte; all the work happens in the loop. A signal that arrives anywhere before poll()
//     leaves its byte in the pipe, so poll() returns at once: no wake-up can be lost.
//   - the read ends of the stdout and stderr pipes of every process whose output is prefixed.
//   - with a stop under way, the deadline of the grace period (poll's timeout).
//
// Each process leads its own process group (group id = its pid), so one killpg() reaches everything
// it started (a shell's children, data-loader workers, ssh's helpers). Exits are observed with
// waitid(WNOWAIT) and reaped only at the very end: a zombie keeps its pid, and so its group id,
// from being reused, so signalling a group can never hit an unrelated process.
#include "engine/launch/supervisor.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <time.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <initializer_list>
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
  // `on_line` (optional) sees each whole line, without its prefix or newline.
  void open(int read_fd, int target_fd, std::string prefix, std::function<void(const std::string&)> on_line = {}) {
    fd_ = read_fd, target_ = target_fd, prefix_ = std::move(prefix), on_line_ = std::move(on_line);
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
    for (size_t end; (end = partial_.find('\n', start)) != std::string::npos; start = end + 1) {
      lines += prefix_ + partial_.substr(start, end + 1 - start);
      if (on_line_) on_line_(partial_.substr(start, end - start));
    }
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
  std::function<void(const std::string&)> on_line_;
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


// The processes whose parent is `parent` (from /proc/PID/stat: "pid (comm) state ppid ...").
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> children;
  DIR* proc = ::opendir("/proc");
  if (!proc) return children;
  while (dirent* entry = ::readdir(proc)) {
    if (entry->d_name[0] < '1' || entry->d_name[0] > '9') continue;
    std::ifstream stat(std::string("/proc/") + entry->d_name + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    size_t close = text.rfind(')');  // the command name may hold spaces and parentheses
    if (close == std::string::npos) continue;
    char state = 0;
    long ppid = 0;
    if (std::sscanf(text.c_str() + close + 1, " %c %ld", &state, &ppid) == 2 && ppid == parent)
      children.push_back(pid_t(std::atol(entry->d_name)));
  }
  ::closedir(proc);
  return children;
}

// ---- the job ---------------------------------------------------------------------------------

struct Process {
  SupervisedProcess spec;
  pid_t pid = -1;          // also its process-group id; -1 while not started
  bool exited = false;     // exit observed (still a zombie until reaped at the end)
  bool failed = false;     // exited non-zero, could not start, or reported a failure in its output
  int status = 0;          // as a shell reports it: the exit code, or 128 + signal
  std::string how;         // "exited with status 7", "was killed by signal 9 (Killed)"
  std::string start_error; // set when exec failed: reported instead of the 126/127 exit
  TaggedPipe out, err;
};

class Job {
 public:
  Job(std::vector<SupervisedProcess> specs, const SupervisorOptions& options) : options_(options) {
    processes_.resize(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) processes_[i].spec = std::move(specs[i]);
  }

  JobEnd run() {
    start_all();
    while (true) {
      collect_exits();
      handle_interrupts();
      if (all_exited()) break;
      wait_for_events();
      check_heartbeats();
      if (stopping_ && !killed_ && Clock::now() >= kill_deadline_)
        kill_survivors("after the " + format_seconds(options_.grace_period_s) + " s grace period");
    }
    for (auto& p : processes_) p.out.finish(), p.err.finish();
    // Whatever the processes left running in their groups goes too (the zombies still hold the ids).
    if (stopping_) signal_groups(SIGKILL);
    for (auto& p : processes_)
      if (p.pid > 0) ::waitpid(p.pid, nullptr, 0);
    return report();
  }

 private:
  // Starts the processes in order; stops early when one cannot start or the job is interrupted.
  void start_all() {
    for (auto& p : processes_) {
      if (g_interrupts > 0) return;
      std::string error = start(p);
      if (error.empty()) continue;
      if (p.pid > 0) {
        p.start_error = error;  // its exit (126 or 127) becomes the failure the loop reports
      } else {
        p.exited = true;
        fail(p, 1, error);
      }
      return;
    }
  }

  // Forks and execs one process. Returns "" or why it could not start; when exec failed, the
  // child exists (p.pid is set) and has exited 127 or 126, as a shell would.
  std::string start(Process& p) {
    std::vector<char*> argv;
    for (auto& a : p.spec.argv) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (auto& e : p.spec.env) envp.push_back(e.data());
    envp.push_back(nullptr);
    const bool tagged = p.spec.output_prefix.has_value();

    // exec_status is closed by a successful exec (O_CLOEXEC) and carries errno when exec fails.
    int out[2] = {-1, -1}, err[2] = {-1, -1}, exec_status[2] = {-1, -1}, null_fd = -1;
    auto close_all = [&](std::initializer_list<int> fds) {
      for (int fd : fds)
        if (fd >= 0) ::close(fd);
    };
    if ((tagged && (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)) ||
        ::pipe2(exec_status, O_CLOEXEC) != 0 ||
        (p.spec.stdin_null && (null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0)) {
      int e = errno;
      close_all({out[0], out[1], err[0], err[1], exec_status[0], exec_status[1], null_fd});
      return std::string("could not be started: cannot create a pipe: ") + std::strerror(e);
    }

    // No handler may run in the child between fork and exec: block everything across fork.
    sigset_t all, previous_mask;
    sigfillset(&all);
    ::sigprocmask(SIG_SETMASK, &all, &previous_mask);
    pid_t supervisor = ::getpid();
    pid_t pid = ::fork();
    if (pid == 0) {
      // The child: only async-signal-safe calls until exec.
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);         // the supervisor SIGKILLed: the process goes too
      if (::getppid() != supervisor) ::_exit(127);  // ... and it may have gone before prctl
      signals_.reset_in_child();
      ::sigprocmask(SIG_SETMASK, &previous_mask, nullptr);
      if (tagged) ::dup2(out[1], STDOUT_FILENO), ::dup2(err[1], STDERR_FILENO);
      if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
      environ = envp.data();  // execvp searches the process's own PATH
      ::execvp(argv[0], argv.data());
      int e = errno;
      (void)!::write(exec_status[1], &e, sizeof e);
      ::_exit(e == ENOENT ? 127 : 126);
    }
    int fork_errno = errno;
    ::sigprocmask(SIG_SETMASK, &previous_mask, nullptr);
    close_all({out[1], err[1], exec_status[1], null_fd});  // the child's ends
    if (pid < 0) {
      close_all({out[0], err[0], exec_status[0]});
      return std::string("could not be started: fork failed: ") + std::strerror(fork_errno);
    }
    // Also here, not only in the child: the group must exist before we might signal it.
    ::setpgid(pid, pid);
    p.pid = pid;
    if (tagged) {
      p.out.open(out[0], STDOUT_FILENO, *p.spec.output_prefix);
      std::function<void(const std::string&)> on_line;
      if (p.spec.failure_in_output)
        on_line = [this, &p](const std::string& line) {
          int status = 0;
          std::string how;
          if (p.spec.failure_in_output(line, status, how)) fail(p, status, how);
        };
      p.err.open(err[0], STDERR_FILENO, *p.spec.output_prefix, std::move(on_line));
    }
    int exec_errno = 0;
    ssize_t n;
    do n = ::read(exec_status[0], &exec_errno, sizeof exec_errno);
    while (n < 0 && errno == EINTR);
    ::close(exec_status[0]);
    if (n == sizeof exec_errno) return "could not run '" + p.spec.argv[0] + "': " + std::strerror(exec_errno);
    return "";
  }

  bool all_exited() const {
    for (const auto& p : processes_)
      if (p.pid > 0 && !p.exited) return false;
    return true;
  }

  int running(const Process* except = nullptr) const {
    int n = 0;
    for (const auto& p : processes_) n += p.pid > 0 && !p.exited && &p != except;
    return n;
  }

  void wait_for_events() {
    std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}};
    std::vector<TaggedPipe*> pipes;
    for (auto& p : processes_)
      for (TaggedPipe* pipe : {&p.out, &p.err})
        if (pipe->fd() >= 0) fds.push_back({pipe->fd(), POLLIN, 0}), pipes.push_back(pipe);
    int timeout_ms = -1;
    if (stopping_ && !killed_) {
      auto left = std::chrono::duration<double, std::milli>(kill_deadline_ - Clock::now()).count();
      timeout_ms = int(std::min(std::max(std::ceil(left), 0.0), 1e9));
    } else if (!stopping_ && options_.hang_timeout_s > 0) {  // the heartbeats are looked at 4 times a timeout
      timeout_ms = int(std::clamp(options_.hang_timeout_s * 250, 10.0, 1000.0));
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0) return;  // EINTR: the loop looks again
    if (fds[0].revents) signals_.drain();
    for (size_t i = 0; i < pipes.size(); ++i)
      if (fds[i + 1].revents) pipes[i]->pump();
  }

  // Notes which processes have exited, without reaping them (see the top of this file).
  void collect_exits() {
    for (auto& p : processes_) {
      if (p.pid <= 0 || p.exited) continue;
      siginfo_t info{};
      int rc = ::waitid(P_PID, id_t(p.pid), &info, WEXITED | WNOHANG | WNOWAIT);
      if (rc != 0 && errno == ECHILD) {  // reaped behind our back (a waitpid(-1) elsewhere in the process)
        p.exited = true;
        p.pid = -1;  // its pid may already be reused: never signal it
        fail(p, 1, "was reaped by someone else: its exit status is lost");
        continue;
      }
      if (rc != 0 || info.si_pid != p.pid) continue;
      p.exited = true;
      int status;
      std::string how;
      if (info.si_code == CLD_EXITED) {
        status = info.si_status;
        how = "exited with status " + std::to_string(info.si_status);
      } else {
        status = 128 + info.si_status;
        how = "was killed by " + signal_name(info.si_status) + (info.si_code == CLD_DUMPED ? ", core dumped" : "");
      }
      if (!p.start_error.empty()) how = p.start_error;
      if (status != 0) fail(p, status, how);
    }
  }

  // A process whose heartbeat file exists (it made progress once) and has not been touched for
  // hang_timeout_s is hung: it fails, which stops the job (a stopped process, SIGSTOP, is SIGKILLed
  // after the grace period).
  void check_heartbeats() {
    if (stopping_ || options_.hang_timeout_s <= 0) return;
    timespec now{};
    ::clock_gettime(CLOCK_REALTIME, &now);
    for (auto& p : processes_) {
      struct stat st{};
      if (p.pid <= 0 || p.exited || p.spec.heartbeat_file.empty() || ::stat(p.spec.heartbeat_file.c_str(), &st) != 0)
        continue;
      const double idle = double(now.tv_sec - st.st_mtim.tv_sec) + 1e-9 * double(now.tv_nsec - st.st_mtim.tv_nsec);
      if (idle > options_.hang_timeout_s)
        fail(p, kHangStatus, "made no progress for " + format_seconds(std::floor(idle * 10) / 10) +
                                 " s (no optimizer step; hang_timeout_s " + format_seconds(options_.hang_timeout_s) +
                                 "): hung");
    }
  }

  // The first failure stops the job; later ones (most of them caused by the stop) are not reported.
  void fail(Process& p, int status, const std::string& how) {
    if (p.failed) return;
    p.failed = true, p.status = status, p.how = how;
    if (stopping_) return;
    failed_ = &p;
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
    stopped_ = running(failed_);
    signal_groups(sig);
    kill_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(options_.grace_period_s));
  }

  void kill_survivors(const std::string& why) {
    killed_ = true;
    killed_why_ = why;
    killed_count_ = running();
    signal_groups(SIGKILL);
  }

  // Every started process's group, exited ones included: their leftovers must stop too.
  void signal_groups(int sig) {
    for (const auto& p : processes_) {
      if (p.pid <= 0) continue;
      // Before the parent: while it is alive (or a zombie) its children's pids cannot be reused.
      if (p.spec.children_leave_group)
        for (pid_t child : children_of(p.pid)) ::kill(child, sig);
      ::killpg(p.pid, sig);  // ESRCH: the group is already empty
    }
  }

  // The one line that says how the job ended, and the supervisor's exit status.
  JobEnd report() const {
    JobEnd end;
    if (failed_) {
      end.reason = failed_->spec.name + " " + failed_->how + stop_summary("; stopped the other ");
      end.status = failed_->status;
    } else if (interrupted_by_) {
      end.reason = "interrupted by " + signal_name(interrupted_by_) + stop_summary("; stopped ");
      end.status = 128 + interrupted_by_;
      end.interrupted = true;
    }
    if (!end.reason.empty()) say(end.reason);
    return end;
  }

  std::string stop_summary(const std::string& lead) const {
    if (stopped_ == 0) return "";
    std::string s = lead + std::to_string(stopped_) + " " + options_.noun + "(s)";
    if (killed_count_ > 0)
      s += " (" + std::to_string(killed_count_) + " killed " + killed_why_ + ")";
    return s;
  }

  SupervisorOptions options_;
  std::vector<Process> processes_;
  SignalWatch signals_;  // constructed before any process is forked: no SIGCHLD can be missed
  bool stopping_ = false;
  bool killed_ = false;
  Clock::time_point kill_deadline_;
  const Process* failed_ = nullptr;
  int interrupted_by_ = 0;
  sig_atomic_t interrupts_seen_ = 0;
  int stopped_ = 0;       // processes still running when the stop began (the failed one not counted)
  int killed_count_ = 0;  // processes still running when SIGKILL was sent
  std::string killed_why_;
};

}  // namespace

std::string format_seconds(double s) {
  char text[64];
  std::snprintf(text, sizeof text, "%.6f", s);
  std::string out = text;
  out.erase(out.find_last_not_of('0') + 1);
  if (out.back() == '.') out.pop_back();
  return out;
}

JobEnd supervise_job(std::vector<SupervisedProcess> processes, const SupervisorOptions& options) {
  Job job(std::move(processes), options);
  return job.run();
}

int supervise(std::vector<SupervisedProcess> processes, const SupervisorOptions& options) {
  return supervise_job(std::move(processes), options).status;
}

}  // namespace tessera
