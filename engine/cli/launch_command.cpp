// `tessera launch [OPTIONS] -- PROGRAM [ARGS...]`: the command line of the launcher
// (engine/launch/launcher.h). Flags override the keys of the --config file: they are merged into its
// JSON before parsing, so a flag's value gets the same checks, and errors, as the key.
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "engine/cli/commands.h"
#include "engine/launch/hosts_launch.h"
#include "engine/launch/launch_config.h"
#include "engine/launch/launcher.h"

namespace tessera {

namespace {

constexpr const char* kUsage = "usage: tessera launch [OPTIONS] -- PROGRAM [ARGS...]";

struct LaunchFlags {
  std::string config;
  std::optional<int> nproc_per_node, node_rank, master_port;
  std::optional<std::string> nnodes;  // "N", or torchrun's "MIN:MAX"
  std::optional<std::string> master_addr, hostfile, launcher, include, exclude, env_file;
  std::optional<int> ssh_port;
  bool exit_with_parent = false;
  std::optional<double> grace_period_s, timeout_s, hang_timeout_s;
  std::optional<int> max_restarts;
  bool tag_output = false, pass_local_rank = false;
  CLI::Option* tag_output_flag = nullptr;
  CLI::Option* pass_local_rank_flag = nullptr;
  std::vector<std::string> command;
};

// The flags that were given, as launch-config JSON keys.
nlohmann::json overrides_from(const LaunchFlags& f) {
  nlohmann::json j = nlohmann::json::object();
  if (f.nproc_per_node) j["nproc_per_node"] = *f.nproc_per_node;
  if (f.nnodes) {  // "MIN:MAX": MAX hosts, and a restart may go on with as few as MIN
    const size_t colon = f.nnodes->find(':');
    auto number = [&](const std::string& text) -> nlohmann::json {
      char* end = nullptr;
      const long n = std::strtol(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0') return text;  // the key's own check names it
      return n;
    };
    if (colon == std::string::npos) {
      j["nnodes"] = number(*f.nnodes);
    } else {
      j["min_nnodes"] = number(f.nnodes->substr(0, colon));
      j["nnodes"] = number(f.nnodes->substr(colon + 1));
    }
  }
  if (f.node_rank) j["node_rank"] = *f.node_rank;
  if (f.master_addr) j["master_addr"] = *f.master_addr;
  if (f.master_port) j["master_port"] = *f.master_port;
  if (f.grace_period_s) j["grace_period_s"] = *f.grace_period_s;
  if (f.timeout_s) j["timeout_s"] = *f.timeout_s;
  if (f.max_restarts) j["max_restarts"] = *f.max_restarts;
  if (f.hang_timeout_s) j["hang_timeout_s"] = *f.hang_timeout_s;
  if (f.tag_output_flag->count() > 0) j["tag_output"] = f.tag_output;
  if (f.pass_local_rank_flag->count() > 0) j["pass_local_rank"] = f.pass_local_rank;
  // A hostfile alone means ssh, as DeepSpeed's runner starts every host of one (it defaults to pdsh).
  if (f.hostfile) j["hosts"]["hostfile"] = *f.hostfile, j["hosts"]["method"] = "ssh";
  if (f.launcher) j["hosts"]["method"] = *f.launcher;
  if (f.include) j["hosts"]["include"] = *f.include;
  if (f.exclude) j["hosts"]["exclude"] = *f.exclude;
  if (f.env_file) j["hosts"]["env_file"] = *f.env_file;
  return j;
}

int run_launch(const LaunchFlags& flags, const std::vector<std::string>& extras) {
  // Options after the program need `--` before the program; say so rather than run without them.
  for (const auto& e : extras) {
    if (e == "--") continue;
    std::cerr << "tessera launch: unknown option '" << e << "'; put the program and its arguments after `--`\n"
              << kUsage << "\n";
    return 2;
  }
  if (flags.command.empty()) {
    std::cerr << "tessera launch: no program given\n" << kUsage << "\n";
    return 2;
  }
  try {
    std::vector<std::string> warnings;
    nlohmann::json given;
    LaunchConfig config = load_launch_config(flags.config, overrides_from(flags), &warnings, &given);
    for (const auto& w : warnings) std::cerr << "tessera launch: warning: " << w << "\n";
    if (flags.ssh_port) {  // DeepSpeed's --ssh_port: ssh's own -p
      config.hosts.ssh_args.push_back("-p");
      config.hosts.ssh_args.push_back(std::to_string(*flags.ssh_port));
    }
    if (flags.exit_with_parent) {
      // A node launcher started over ssh (or pdsh, srun): when the connection goes, sshd's session
      // process, its parent, exits; SIGHUP then stops this node's ranks like a hang-up would.
      pid_t parent = ::getppid();
      ::prctl(PR_SET_PDEATHSIG, SIGHUP);
      if (::getppid() != parent) return 128 + SIGHUP;
    }
    if (config.hosts.method != "local") {
      NodeCounts asked;
      if (given.contains("nnodes")) asked.nnodes = config.nnodes;
      if (given.contains("nproc_per_node")) asked.nproc_per_node = config.nproc_per_node;
      return launch_on_hosts(config, flags.command, asked);
    }
    return launch(config, flags.command);
  } catch (const ConfigError& e) {
    std::cerr << "tessera launch: " << e.what();
    if (std::string(e.what()).back() != '\n') std::cerr << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "tessera launch: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace

void register_launch_command(CLI::App& app, int& exit_code, const std::vector<std::string>& program) {
  // Owned by the callback, which CLI11 keeps as long as the App.
  auto flags = std::make_shared<LaunchFlags>();
  CLI::App* sub = app.add_subcommand(
      "launch",
      "Start this node's ranks of a job, like torchrun, or with --hostfile every host's: tessera launch [OPTIONS] -- "
      "PROGRAM [ARGS...]");
  // torchrun's names, and DeepSpeed's launcher's (--num_gpus, --num_nodes) for the same counts.
  sub->add_option("--nproc-per-node,--nproc_per_node,--num_gpus,--num-gpus", flags->nproc_per_node,
                  "Ranks to start on this node (1)");
  sub->add_option("--nnodes,--num_nodes,--num-nodes", flags->nnodes,
                  "Nodes in the job (1); run the launcher on each. With a hostfile MIN:MAX (torchrun's form): MAX "
                  "hosts, and a restart goes on with those still reachable, at least MIN");
  sub->add_option("--node-rank,--node_rank", flags->node_rank, "This node's index, 0 .. nnodes-1 (0)");
  sub->add_option("--master-addr,--master_addr", flags->master_addr,
                  "Address of rank 0's node (127.0.0.1; with a hostfile its first host)");
  sub->add_option("--master-port,--master_port", flags->master_port, "Rendezvous port on the master (29500)");
  sub->add_option("--config", flags->config, "Launch config JSON file; flags override its keys");
  sub->add_option("--hostfile", flags->hostfile,
                  "Start the job on the hosts of this file (\"HOST slots=N\" lines, DeepSpeed's format) over ssh");
  sub->add_option("--launcher", flags->launcher, "How to reach the hosts: ssh (default with --hostfile), pdsh, slurm");
  sub->add_option("--include", flags->include, "Only these hosts and slots of the hostfile: host1:0,1@host2");
  sub->add_option("--exclude", flags->exclude, "Every host and slot of the hostfile but these: host1:0@host3");
  sub->add_option("--env-file,--env_file", flags->env_file,
                  "NAME=VALUE lines set on every host (default: .tessera_env or .deepspeed_env, here or in ~)");
  sub->add_option("--ssh-port,--ssh_port", flags->ssh_port, "ssh's port on the hosts");
  sub->add_flag("--exit-with-parent", flags->exit_with_parent,
                "Stop the ranks when this launcher's parent exits (set on each host by a multi-host launch)");
  flags->tag_output_flag =
      sub->add_flag("--tag-output,--tag_output", flags->tag_output, "Prefix each output line with [rankN]: ");
  flags->pass_local_rank_flag = sub->add_flag(
      "--pass-local-rank,--pass_local_rank", flags->pass_local_rank,
      "Append --local_rank=N to each rank's arguments, as DeepSpeed's launcher does (scripts that read args.local_rank)");
  sub->add_option("--grace-period", flags->grace_period_s,
                  "Seconds between SIGTERM and SIGKILL when stopping ranks after a failure (5)");
  sub->add_option("--timeout", flags->timeout_s, "Rendezvous/collective timeout in seconds, as TESSERA_TIMEOUT_S (300)");
  sub->add_option("--max-restarts,--max_restarts", flags->max_restarts,
                  "Start every rank again after a failure or a hang, up to this many times (torchrun's flag; 0)");
  sub->add_option("--hang-timeout,--hang_timeout", flags->hang_timeout_s,
                  "Seconds without an optimizer step, after a rank's first, that make it hung: the job stops "
                  "(and restarts with --max-restarts); 0: off (0)");
  sub->add_option("program", flags->command, "The program to run as every rank, and its arguments (after --)");
  // Unknown options land in remaining() and are reported by run_launch with a hint about `--`.
  sub->allow_extras();
  sub->callback([sub, flags, program, &exit_code] {
    if (!program.empty()) flags->command = program;
    exit_code = run_launch(*flags, sub->remaining());
  });
}

}  // namespace tessera
