// Starting a job on several hosts (engine/launch/hosts_launch.h).
#include "engine/launch/hosts_launch.h"

#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

#include "engine/config/config_io.h"
#include "engine/launch/restarts.h"
#include "engine/launch/supervisor.h"
#include "parallel/rendezvous.h"

extern char** environ;

namespace tessera {

namespace {

std::vector<std::string> own_environment() {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) out.emplace_back(*e);
  return out;
}

std::string lookup(const std::vector<std::string>& environment, const std::string& name) {
  for (const auto& entry : environment)
    if (entry.size() > name.size() && entry.compare(0, name.size(), name) == 0 && entry[name.size()] == '=')
      return entry.substr(name.size() + 1);
  return "";
}

std::vector<std::string> with_variable(std::vector<std::string> environment, const std::string& name,
                                       const std::string& value) {
  for (auto& entry : environment)
    if (entry.compare(0, name.size() + 1, name + "=") == 0) {
      entry = name + "=" + value;
      return environment;
    }
  environment.push_back(name + "=" + value);
  return environment;
}

bool file_exists(const std::string& path) { return !path.empty() && ::access(path.c_str(), R_OK) == 0; }

std::string this_program() {
  char path[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) throw std::runtime_error("cannot find this program's path (/proc/self/exe); set hosts.tessera_path");
  return std::string(path, size_t(n));
}

std::string current_directory() {
  char path[PATH_MAX];
  if (!::getcwd(path, sizeof path)) throw std::runtime_error("cannot read the current directory");
  return path;
}

// "a b" from {"a", "b"}; ssh joins its command arguments with spaces as well.
std::string join(const std::vector<std::string>& words, const std::string& separator = " ") {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : separator) + w;
  return out;
}

// ssh's own options before the user's: never prompt (a password prompt on one of many hosts would
// hang the job), and give up on a host within connect_timeout_s.
std::vector<std::string> ssh_options(const LaunchHostsConfig& hosts) {
  std::vector<std::string> options = {
      "-o", "BatchMode=yes", "-o", "ConnectTimeout=" + std::to_string(int(std::max(1.0, hosts.connect_timeout_s)))};
  options.insert(options.end(), hosts.ssh_args.begin(), hosts.ssh_args.end());
  return options;
}

// Tries every host at once with `ssh HOST true`: for each host, "" or why it cannot be reached.
std::vector<std::string> reach_hosts(const std::vector<HostSlots>& hosts, const LaunchHostsConfig& config) {
  std::vector<std::pair<std::string, FILE*>> probes;
  for (const auto& h : hosts) {
    std::vector<std::string> words = {"ssh", "-n"};
    for (const auto& o : ssh_options(config)) words.push_back(o);
    words.insert(words.end(), {h.host, "true"});
    std::string line;
    for (const auto& w : words) line += shell_quote(w) + " ";
    probes.emplace_back(h.host, ::popen((line + "2>&1").c_str(), "r"));
  }
  std::vector<std::string> failures;
  for (auto& [host, pipe] : probes) {
    failures.emplace_back();
    if (!pipe) {
      failures.back() = "cannot run ssh";
      continue;
    }
    std::string output;
    char buffer[4096];
    for (size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) output.append(buffer, n);
    int status = ::pclose(pipe);
    if (status == 0) continue;
    while (!output.empty() && (output.back() == '\n' || output.back() == '\r')) output.pop_back();
    std::string why = output.substr(output.rfind('\n') == std::string::npos ? 0 : output.rfind('\n') + 1);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    failures.back() = "ssh exited with status " + std::to_string(code) + (why.empty() ? "" : ": " + why);
  }
  return failures;
}

// Throws naming each host that cannot be reached.
void check_hosts_reachable(const std::vector<HostSlots>& hosts, const LaunchHostsConfig& config) {
  const std::vector<std::string> why = reach_hosts(hosts, config);
  std::string failures;
  for (size_t k = 0; k < hosts.size(); ++k)
    if (!why[k].empty()) failures += "\n  " + hosts[k].host + ": " + why[k];
  if (!failures.empty())
    throw std::runtime_error("cannot reach every host with ssh (" + format_seconds(config.connect_timeout_s) +
                             " s connect timeout); nothing was started:" + failures);
}

// --nnodes MIN:MAX, before a restart: the hosts that stopped answering are dropped (their node
// ranks and devices with them) while at least min_nnodes remain; the master moves to the first
// host left unless it was given. Returns "" or why the job cannot go on.
std::string drop_unreachable_hosts(const LaunchConfig& config, std::vector<HostSlots>& hosts, LaunchConfig& node) {
  const std::vector<std::string> why = reach_hosts(hosts, config.hosts);
  std::vector<HostSlots> kept;
  std::vector<std::string> devices;
  std::string dropped;
  for (size_t k = 0; k < hosts.size(); ++k) {
    if (why[k].empty()) {
      kept.push_back(hosts[k]);
      if (!node.node_devices.empty()) devices.push_back(node.node_devices[k]);
    } else {
      dropped += (dropped.empty() ? "" : ", ") + hosts[k].host + " (" + why[k] + ")";
    }
  }
  if (dropped.empty()) return "";
  if (static_cast<int>(kept.size()) < config.min_nnodes)
    return "only " + std::to_string(kept.size()) + " of " + std::to_string(hosts.size()) + " hosts answer, fewer than "
           "the " + std::to_string(config.min_nnodes) + " of --nnodes " + std::to_string(config.min_nnodes) + ":" +
           std::to_string(config.nnodes) + "; unreachable: " + dropped;
  std::fprintf(stderr, "tessera launch: dropping %s; the job goes on with %zu host(s)\n", dropped.c_str(), kept.size());
  hosts = std::move(kept);
  node.nnodes = static_cast<int>(hosts.size());
  if (config.master_addr.empty()) node.master_addr = hosts.front().host;
  if (!node.node_devices.empty()) node.node_devices = std::move(devices);
  return "";
}

// pdsh's line for a host whose command failed: "pdsh@NAME: HOST: ssh exited with exit code N".
bool pdsh_reported_failure(const std::string& line, int& status, std::string& how) {
  const std::string marker = ": ssh exited with exit code ";
  size_t at = line.find(marker);
  if (line.rfind("pdsh@", 0) != 0 || at == std::string::npos) return false;
  status = std::atoi(line.c_str() + at + marker.size());
  if (status == 0) return false;
  size_t host_start = line.find(": ") + 2;
  how = "reported that host " + line.substr(host_start, at - host_start) + " exited with status " +
        std::to_string(status);
  return true;
}

// srun's line for a node whose task failed: "srun: error: NODE: task K: Exited with exit code N".
// srun itself exits with the largest status of all, often that of a node stopped because of this one.
bool srun_reported_failure(const std::string& line, int& status, std::string& how) {
  const std::string lead = "srun: error: ", marker = ": Exited with exit code ";
  size_t at = line.find(marker);
  if (line.rfind(lead, 0) != 0 || at == std::string::npos) return false;
  status = std::atoi(line.c_str() + at + marker.size());
  if (status == 0) return false;
  std::string where = line.substr(lead.size(), at - lead.size());  // "h2: task 1"
  size_t colon = where.find(": task ");
  how = "reported that node " + (colon == std::string::npos ? where : where.substr(0, colon) + " (node " +
                                                                         where.substr(colon + 7) + ")") +
        " exited with status " + std::to_string(status);
  return true;
}

}  // namespace

std::string shell_quote(const std::string& text) {
  if (!text.empty() && text.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@%") ==
                           std::string::npos)
    return text;
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

EnvironmentList forwarded_environment(const LaunchHostsConfig& hosts, const std::vector<std::string>& environment,
                                      const std::string& home, std::string* env_file_used) {
  std::map<std::string, std::string> vars;
  for (const auto& entry : environment) {
    size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    std::string name = entry.substr(0, eq);
    for (const auto& prefix : hosts.export_prefixes)
      if (!prefix.empty() && name.compare(0, prefix.size(), prefix) == 0) vars[name] = entry.substr(eq + 1);
  }
  std::string file = hosts.env_file;
  if (file.empty())
    for (const std::string& candidate : {std::string(".tessera_env"), std::string(".deepspeed_env"),
                                         home.empty() ? "" : home + "/.tessera_env",
                                         home.empty() ? "" : home + "/.deepspeed_env"})
      if (file_exists(candidate)) {
        file = candidate;
        break;
      }
  if (env_file_used) *env_file_used = file;
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) throw ConfigError("hosts.env_file: cannot read " + file);
    int number = 0;
    for (std::string line; std::getline(in, line);) {
      ++number;
      size_t start = line.find_first_not_of(" \t");
      if (start == std::string::npos || line[start] == '#') continue;
      line = line.substr(start);
      if (line.rfind("export ", 0) == 0) line = line.substr(7);
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      size_t eq = line.find('=');
      if (eq == 0 || eq == std::string::npos)
        throw ConfigError(file + ":" + std::to_string(number) + ": expected NAME=VALUE, found \"" + line + "\"");
      vars[line.substr(0, eq)] = line.substr(eq + 1);
    }
  }
  return EnvironmentList(vars.begin(), vars.end());
}

HostsPlan plan_hosts(const LaunchConfig& config, const NodeCounts& asked, const std::vector<std::string>& environment) {
  HostsPlan plan;
  LaunchConfig& node = plan.node_config;
  node = config;
  node.hosts = LaunchHostsConfig{};  // each node's launcher starts its own ranks
  node.node_rank = 0;
  node.tag_output = true;  // every line names its rank; the host is added here (or by pdsh, srun)
  if (config.hosts.method == "slurm") {
    std::string nodes = lookup(environment, "SLURM_JOB_NUM_NODES");
    if (nodes.empty()) nodes = lookup(environment, "SLURM_NNODES");
    if (!asked.nnodes && nodes.empty())
      throw ConfigError("hosts.method \"slurm\" runs inside a SLURM allocation (salloc, sbatch): "
                        "SLURM_JOB_NUM_NODES is not set, and no --nnodes was given");
    node.nnodes = asked.nnodes ? *asked.nnodes : std::atoi(nodes.c_str());
    if (node.master_addr.empty()) {
      std::string nodelist = lookup(environment, "SLURM_JOB_NODELIST");
      if (nodelist.empty())
        throw ConfigError("hosts.method \"slurm\": SLURM_JOB_NODELIST is not set; give --master-addr");
      node.master_addr = first_slurm_host(nodelist);
    }
    for (int k = 0; k < node.nnodes; ++k) plan.hosts.push_back({"node " + std::to_string(k), {}});
    return plan;
  }
  std::vector<HostSlots> all = read_hostfile(config.hosts.hostfile);
  plan.hosts = select_hosts(all, config.hosts.include, config.hosts.exclude, asked.nnodes, asked.nproc_per_node);
  // torchrun's variables give every node the same LOCAL_WORLD_SIZE: the hosts must agree.
  std::string counts;
  bool uneven = false;
  for (const auto& h : plan.hosts) {
    counts += (counts.empty() ? "" : ", ") + h.host + " " + std::to_string(h.slots.size());
    uneven = uneven || h.slots.size() != plan.hosts[0].slots.size();
  }
  if (uneven)
    throw ConfigError("the hosts have different numbers of slots (" + counts +
                      "); every node runs the same number of ranks: use --num_gpus N, or --include");
  node.nnodes = int(plan.hosts.size());
  node.nproc_per_node = int(plan.hosts[0].slots.size());
  if (node.master_addr.empty()) node.master_addr = plan.hosts[0].host;
  // Slots other than 0..n-1 (chosen by --include/--exclude) become each node's CUDA_VISIBLE_DEVICES.
  bool every_slot_from_zero = true;
  for (const auto& h : plan.hosts)
    for (size_t i = 0; i < h.slots.size(); ++i) every_slot_from_zero = every_slot_from_zero && h.slots[i] == int(i);
  node.node_devices.clear();
  if (!every_slot_from_zero)
    for (const auto& h : plan.hosts) {
      std::string devices;
      for (int s : h.slots) devices += (devices.empty() ? "" : ",") + std::to_string(s);
      node.node_devices.push_back(devices);
    }
  return plan;
}

std::string node_command_line(const LaunchConfig& node_config, const std::string& node_rank, const EnvironmentList& env,
                              const std::string& cwd, const std::string& tessera_path,
                              const std::vector<std::string>& command) {
  nlohmann::json j = launch_config_to_json(node_config);
  j.erase("hosts");  // the node's launcher is a local one: its defaults
  j.erase("node_rank");
  std::vector<std::string> words = {"cd", shell_quote(cwd), "&&", "exec", "env"};
  for (const auto& [name, value] : env) words.push_back(shell_quote(name + "=" + value));
  words.insert(words.end(), {shell_quote(tessera_path), "launch", "--config", shell_quote(j.dump()), "--node-rank",
                             node_rank, "--exit-with-parent", "--"});
  for (const auto& c : command) words.push_back(shell_quote(c));
  return join(words);
}

static std::vector<SupervisedProcess> host_processes(const LaunchConfig& config, const std::vector<HostSlots>& hosts,
                                                     const LaunchConfig& node, const std::vector<std::string>& environment,
                                                     const EnvironmentList& env, const std::string& cwd,
                                                     const std::string& tessera, const std::vector<std::string>& command);

int launch_on_hosts(const LaunchConfig& config, const std::vector<std::string>& command, const NodeCounts& asked) {
  if (command.empty() || command[0].empty()) throw ConfigError("tessera launch: no program to run");
  ConfigReport report;
  parse_launch_config(launch_config_to_json(config), report);
  if (!report.ok()) throw ConfigError("invalid launch config:\n" + report.errors());

  const std::vector<std::string> environment = own_environment();
  const HostsPlan plan = plan_hosts(config, asked, environment);
  const LaunchHostsConfig& hosts = config.hosts;
  const std::string tessera = hosts.tessera_path.empty() ? this_program() : hosts.tessera_path;
  const std::string cwd = current_directory();
  const EnvironmentList env = forwarded_environment(hosts, environment, lookup(environment, "HOME"));
  if (hosts.method == "ssh" || hosts.method == "pdsh") check_hosts_reachable(plan.hosts, hosts);
  // The whole job restarts (every host's launcher, engine/launch/restarts.h); a node launcher's own
  // restarts would leave the other hosts' ranks waiting in the old rendezvous. Its hang detection
  // fails its host, which stops (and restarts) the job.
  // With --nnodes MIN:MAX a restart goes on with the hosts that still answer.
  std::vector<HostSlots> alive = plan.hosts;
  LaunchConfig layout = plan.node_config;
  return run_with_restarts(config.max_restarts, [&](int count, const std::string& reason) {
    if (count > 0 && config.min_nnodes > 0) {
      const std::string why = drop_unreachable_hosts(config, alive, layout);
      if (!why.empty()) {
        std::fprintf(stderr, "tessera launch: cannot restart: %s\n", why.c_str());
        return JobEnd{1, false, why, /*final=*/true};
      }
    }
    LaunchConfig node = layout;
    node.max_restarts = 0;
    node.min_nnodes = 0;
    for (const auto& [name, value] : restart_environment(config.max_restarts, count, reason)) node.env[name] = value;
    return supervise_job(host_processes(config, alive, node, environment, env, cwd, tessera, command),
                         {config.grace_period_s, hosts.method == "ssh" ? "host" : "launcher"});
  });
}

// The processes that start `node`'s launcher on every host of `plan`: one ssh per host, or one pdsh
// or srun for all of them.
static std::vector<SupervisedProcess> host_processes(const LaunchConfig& config, const std::vector<HostSlots>& targets,
                                                     const LaunchConfig& node, const std::vector<std::string>& environment,
                                                     const EnvironmentList& env, const std::string& cwd,
                                                     const std::string& tessera, const std::vector<std::string>& command) {
  const LaunchHostsConfig& hosts = config.hosts;
  auto line_for = [&](const std::string& node_rank) {
    return node_command_line(node, node_rank, env, cwd, tessera, command);
  };

  std::vector<SupervisedProcess> processes;
  if (hosts.method == "ssh") {
    for (size_t k = 0; k < targets.size(); ++k) {
      SupervisedProcess p;
      const std::string& host = targets[k].host;
      p.name = "host " + host + " (node " + std::to_string(k) + ")";
      p.argv = {"ssh", "-n"};
      for (const auto& o : ssh_options(hosts)) p.argv.push_back(o);
      p.argv.insert(p.argv.end(), {host, line_for(std::to_string(k))});
      p.env = environment;
      p.output_prefix = host + ": ";  // pdsh's format, so both read the same
      processes.push_back(std::move(p));
    }
  } else if (hosts.method == "pdsh") {
    std::vector<std::string> names;
    for (const auto& h : targets) names.push_back(h.host);
    // pdsh puts each host's index in its -w list where the line says %n, and reads any other % as
    // its own: a literal one must be %%.
    const std::string marker = "@NODE_RANK@";
    std::string line = line_for(marker), escaped;
    for (size_t i = 0; i < line.size(); ++i) {
      if (line.compare(i, marker.size(), marker) == 0) escaped += "%n", i += marker.size() - 1;
      else escaped += line[i] == '%' ? std::string("%%") : std::string(1, line[i]);
    }
    SupervisedProcess p;
    p.name = "pdsh";
    p.argv = {"pdsh", "-S", "-f", "1024", "-w", join(names, ","), escaped};
    p.env = with_variable(environment, "PDSH_RCMD_TYPE", "ssh");
    p.env = with_variable(p.env, "PDSH_SSH_ARGS_APPEND", join(ssh_options(hosts)));
    p.output_prefix = "";  // pdsh prefixes each line with its host; its stderr is watched for failures
    p.failure_in_output = pdsh_reported_failure;
    p.children_leave_group = true;
    processes.push_back(std::move(p));
  } else {  // slurm: one node launcher per node of the allocation
    SupervisedProcess p;
    p.name = "srun";
    p.argv = {"srun", "--nodes=" + std::to_string(node.nnodes),
              "--ntasks=" + std::to_string(node.nnodes), "--ntasks-per-node=1", "--kill-on-bad-exit=1",
              "--label", "sh", "-c", line_for("\"$SLURM_NODEID\"")};
    p.env = environment;
    p.output_prefix = "";  // srun --label prefixes each line with its node; its stderr is watched for failures
    p.failure_in_output = srun_reported_failure;
    processes.push_back(std::move(p));
  }
  return processes;  // pdsh and srun are one process for every host
}

}  // namespace tessera
