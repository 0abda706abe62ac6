#include "engine/cli/plan_trials.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>

namespace tessera {

using nlohmann::json;

namespace {

std::string self_executable() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return "tessera";
  path[n] = 0;
  return path;
}

// Runs argv with stdout and stderr into one pipe; returns (status, output).
std::pair<int, std::string> run_captured(const std::vector<std::string>& argv, double timeout_s) {
  int fds[2];
  if (pipe(fds) != 0) return {-1, "pipe failed"};
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    setpgid(0, 0);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::perror("exec");
    _exit(127);
  }
  close(fds[1]);
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
  std::string output;
  const double deadline = double(time(nullptr)) + timeout_s;
  int status = 0;
  bool done = false;
  while (!done) {
    char buf[4096];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof buf)) > 0) output.append(buf, size_t(n));
    if (waitpid(pid, &status, WNOHANG) == pid) {
      done = true;
      while ((n = read(fds[0], buf, sizeof buf)) > 0) output.append(buf, size_t(n));
    } else if (double(time(nullptr)) > deadline) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      output += "\n[trial timed out after " + std::to_string(int(timeout_s)) + " s]";
      return {124, output};
    } else {
      usleep(50000);
    }
  }
  close(fds[0]);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), output};
}

std::string tail(const std::string& text, size_t n) { return text.size() <= n ? text : text.substr(text.size() - n); }

}  // namespace

std::vector<Trial> run_trials(const planner::PlanResult& plan, int k, const TrialOptions& options) {
  if (options.program.empty()) throw std::invalid_argument("--trials needs the training program after --: tessera plan ... --trials 3 -- PROGRAM ARGS");
  std::vector<Trial> trials;
  // In the working directory, not /tmp: ranks on other hosts (or in other mount namespaces) see
  // the job's working directory, not this machine's /tmp.
  char dir_template[] = "tessera-trials-XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (!dir) throw std::runtime_error("--trials: could not make a folder for the trial configs");
  const std::regex step_line(R"(^step (\d+) \|.*\| step ([0-9.]+) ms)");
  for (int i = 0; i < std::min<int>(k, int(plan.ranked.size())); ++i) {
    const planner::Candidate& c = plan.ranked[i];
    Trial t;
    t.rank = i + 1;
    t.layout = c.layout;
    t.predicted = c.cost.total();
    t.config = c.config;
    json config = c.config;
    config["steps_per_print"] = 1;  // a progress line, with its step time, every step
    char cwd[4096];
    const std::string folder = (getcwd(cwd, sizeof cwd) ? std::string(cwd) + "/" : std::string()) + dir;
    const std::string path = folder + "/trial" + std::to_string(i + 1) + ".json";
    std::ofstream(path) << config.dump(2) << "\n";
    std::vector<std::string> argv = {self_executable(), "launch", "--master-port", std::to_string(options.master_port + i)};
    if (options.hostfile.empty()) argv.insert(argv.end(), {"--nproc-per-node", std::to_string(plan.world)});
    else argv.insert(argv.end(), {"--hostfile", options.hostfile});
    argv.push_back("--");
    bool placed = false;
    for (const auto& a : options.program) {
      argv.push_back(a == "{config}" ? path : a);
      placed |= a == "{config}";
    }
    if (!placed) argv.insert(argv.end(), {"--config", path});
    std::cerr << "tessera plan: trial " << t.rank << "/" << std::min<int>(k, int(plan.ranked.size())) << ": "
              << c.layout.label() << std::endl;
    const auto [status, output] = run_captured(argv, options.timeout_s);
    std::vector<double> steps;
    std::istringstream lines(output);
    std::string line;
    std::smatch m;
    while (std::getline(lines, line))
      if (std::regex_search(line, m, step_line)) steps.push_back(std::stod(m[2].str()) / 1000.0);
    if (status != 0) t.error = "exited " + std::to_string(status) + ": " + tail(output, 400);
    else if (steps.size() < 2) t.error = "fewer than 2 progress lines with a step time (run at least 2 steps)";
    else {
      std::vector<double> timed(steps.begin() + 1, steps.end());  // the first step warms up
      std::sort(timed.begin(), timed.end());
      const size_t n = timed.size();
      t.measured = n % 2 ? timed[n / 2] : (timed[n / 2 - 1] + timed[n / 2]) / 2;
    }
    std::remove(path.c_str());
    trials.push_back(std::move(t));
  }
  rmdir(dir);
  return trials;
}

const Trial* fastest(const std::vector<Trial>& trials) {
  const Trial* best = nullptr;
  for (const auto& t : trials)
    if (t.measured && (!best || *t.measured < *best->measured)) best = &t;
  return best;
}

json trials_to_json(const std::vector<Trial>& trials) {
  json out = json::array();
  for (const auto& t : trials) {
    json j = {{"rank", t.rank}, {"layout", planner::to_json(t.layout)}, {"predicted_seconds", t.predicted}};
    if (t.measured) j["measured_seconds"] = *t.measured, j["measured_over_predicted"] = *t.measured / t.predicted;
    else j["error"] = t.error;
    out.push_back(std::move(j));
  }
  return out;
}

std::string format_trials(const std::vector<Trial>& trials) {
  std::ostringstream out;
  out << "\ntrials (the real engine, median step after the first):\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-4s %-58s %12s %12s %10s\n", "#", "layout", "predicted", "measured", "ratio");
  out << line;
  double error = 0;
  int measured = 0;
  for (const auto& t : trials) {
    if (t.measured) {
      std::snprintf(line, sizeof line, "%-4d %-58s %12.4f %12.4f %10.2f\n", t.rank, t.layout.label().c_str(), t.predicted,
                    *t.measured, *t.measured / t.predicted);
      error += std::abs(*t.measured / t.predicted - 1);
      ++measured;
    } else {
      std::snprintf(line, sizeof line, "%-4d %-58s %12.4f %12s\n", t.rank, t.layout.label().c_str(), t.predicted, "failed");
    }
    out << line;
    if (!t.measured) out << "     " << t.error << "\n";
  }
  if (measured > 0) {
    std::snprintf(line, sizeof line, "predictions off by %.0f%% on average (|measured / predicted - 1|)\n",
                  100 * error / measured);
    out << line;
  }
  if (const Trial* best = fastest(trials))
    out << "chosen (fastest measured): #" << best->rank << " " << best->layout.label() << "\n";
  return out.str();
}

}  // namespace tessera
