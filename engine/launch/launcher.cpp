// The launcher: a node's ranks, each with torchrun's variables, run and watched by the supervisor
// (engine/launch/supervisor.h), which stops them all when one fails.
#include "engine/launch/launcher.h"

#include <algorithm>
#include <map>

#include "engine/launch/restarts.h"
#include "engine/launch/supervisor.h"

extern char** environ;

namespace tessera {

namespace {

// Where a program's own arguments begin: after `python [options] script.py` (or `-m module`),
// else right after the program.
size_t script_end(const std::vector<std::string>& args) {
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
  env["MASTER_ADDR"] = c.master_address();
  env["MASTER_PORT"] = std::to_string(c.master_port);
  env["TESSERA_TIMEOUT_S"] = format_seconds(c.timeout_s);
  env["TESSERA_LAUNCHED"] = "1";  // errors then point at tessera launch's flags, not the variables it sets
  // The launcher prefixes every line: Python's tessera then keeps torch.distributed from adding a second "[rankN]: ".
  if (c.tag_output) env["TESSERA_TAG_OUTPUT"] = "1";
  if (!c.node_devices.empty()) env["CUDA_VISIBLE_DEVICES"] = c.node_devices[size_t(c.node_rank)];
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

  // With max_restarts every rank starts again after a failure or a hang (engine/launch/restarts.h);
  // a node launcher started by a hosts launcher runs with 0, its restarts being the whole job's.
  HeartbeatDirectory heartbeats(config.hang_timeout_s > 0);
  return run_with_restarts(config.max_restarts, [&](int count, const std::string& reason) {
    LaunchConfig attempt = config;
    for (const auto& [name, value] : restart_environment(config.max_restarts, count, reason))
      if (count > 0 || !attempt.env.count(name)) attempt.env[name] = value;
    std::vector<SupervisedProcess> ranks;
    for (int local_rank = 0; local_rank < config.nproc_per_node; ++local_rank) {
      int rank = config.node_rank * config.nproc_per_node + local_rank;
      SupervisedProcess p;
      p.name = "rank " + std::to_string(rank) + " (local rank " + std::to_string(local_rank) + ")";
      p.argv = command;
      if (config.pass_local_rank)  // where DeepSpeed's launcher puts it: before the script's own arguments
        p.argv.insert(p.argv.begin() + static_cast<std::ptrdiff_t>(script_end(p.argv)),
                      "--local_rank=" + std::to_string(local_rank));
      p.heartbeat_file = heartbeats.file_for(rank, count);
      if (!p.heartbeat_file.empty()) attempt.env["TESSERA_HEARTBEAT_FILE"] = p.heartbeat_file;
      p.env = rank_environment(attempt, local_rank);
      if (config.tag_output) p.output_prefix = "[rank" + std::to_string(rank) + "]: ";
      ranks.push_back(std::move(p));
    }
    return supervise_job(std::move(ranks), {config.grace_period_s, "rank", config.hang_timeout_s});
  });
}

}  // namespace tessera
