// A job across hosts, the parts that need no second host: DeepSpeed's hostfile and its filters,
// the plan (node counts, master, each node's devices, SLURM's allocation), the environment
// forwarded to every host, and the command line a host runs, executed here by a real shell.
// tests/python/launch/test_cluster.py runs the whole launch over ssh and pdsh on emulated hosts.
#include <catch2/catch.hpp>
#include <fstream>
#include <functional>

#include "engine/config/config_io.h"
#include "engine/launch/hostfile.h"
#include "engine/launch/hosts_launch.h"
#include "tests/subprocess.h"

using namespace tessera;
using tessera::testing::contains;
using tessera::testing::TempDir;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

std::string slots_of(const std::vector<HostSlots>& hosts) {
  std::string out;
  for (const auto& h : hosts) {
    out += h.host + ":";
    for (int s : h.slots) out += std::to_string(s);
    out += " ";
  }
  return out;
}

const char* kHostfile = R"(# the cluster
worker-1 slots=4
worker-2   slots=4   # a comment after the host

worker-3 slots=2
)";

}  // namespace

TEST_CASE("hostfile: DeepSpeed's format, and errors that name the file and line") {
  auto hosts = parse_hostfile(kHostfile, "hosts.txt");
  CHECK(slots_of(hosts) == "worker-1:0123 worker-2:0123 worker-3:01 ");
  CHECK(contains(error_of([] { parse_hostfile("worker-1 slots=4\nworker-2 slot=4\n", "h"); }),
                 "h:2: expected \"HOST slots=N\" (N >= 1), found \"worker-2 slot=4\""));
  CHECK(contains(error_of([] { parse_hostfile("worker-1 slots=0\n", "h"); }), "h:1: expected \"HOST slots=N\""));
  CHECK(contains(error_of([] { parse_hostfile("worker-1 slots=2 extra\n", "h"); }), "h:1: expected"));
  CHECK(contains(error_of([] { parse_hostfile("a slots=1\na slots=2\n", "h"); }), "h:2: host \"a\" is listed twice"));
  CHECK(contains(error_of([] { parse_hostfile("# nothing\n\n", "h"); }), "h: no hosts"));
  CHECK(contains(error_of([] { read_hostfile("/nonexistent/hosts"); }), "hostfile /nonexistent/hosts: cannot be read"));
}

TEST_CASE("hostfile: --include, --exclude, --num_nodes and --num_gpus select as DeepSpeed's runner does") {
  auto all = parse_hostfile(kHostfile, "hosts.txt");
  CHECK(slots_of(select_hosts(all, "", "", std::nullopt, std::nullopt)) == "worker-1:0123 worker-2:0123 worker-3:01 ");
  // The hostfile's order decides the node ranks, not the filter's.
  CHECK(slots_of(select_hosts(all, "worker-3@worker-1:2,0", "", std::nullopt, std::nullopt)) == "worker-1:02 worker-3:01 ");
  CHECK(slots_of(select_hosts(all, "", "worker-2@worker-1:3", std::nullopt, std::nullopt)) == "worker-1:012 worker-3:01 ");
  CHECK(slots_of(select_hosts(all, "", "worker-3:0,1", std::nullopt, std::nullopt)) == "worker-1:0123 worker-2:0123 ");
  CHECK(slots_of(select_hosts(all, "", "", 2, std::nullopt)) == "worker-1:0123 worker-2:0123 ");
  CHECK(slots_of(select_hosts(all, "", "", std::nullopt, 2)) == "worker-1:01 worker-2:01 worker-3:01 ");

  CHECK(contains(error_of([&] { select_hosts(all, "worker-9", "", std::nullopt, std::nullopt); }),
                 "--include: host \"worker-9\" is not in the hostfile"));
  CHECK(contains(error_of([&] { select_hosts(all, "worker-3:2", "", std::nullopt, std::nullopt); }),
                 "--include: host \"worker-3\" has slots 0..1, not 2"));
  CHECK(contains(error_of([&] { select_hosts(all, "worker-1:x", "", std::nullopt, std::nullopt); }),
                 "slot \"x\" of worker-1 is not a number"));
  CHECK(contains(error_of([&] { select_hosts(all, "worker-1", "worker-2", std::nullopt, std::nullopt); }),
                 "--include and --exclude cannot be used together"));
  CHECK(contains(error_of([&] { select_hosts(all, "worker-1", "", 1, std::nullopt); }),
                 "--num_nodes/--num_gpus cannot be used with --include/--exclude"));
  CHECK(contains(error_of([&] { select_hosts(all, "", "", 4, std::nullopt); }), "--num_nodes 4: the hostfile has 3 host(s)"));
  CHECK(contains(error_of([&] { select_hosts(all, "", "", std::nullopt, 3); }),
                 "--num_gpus 3: host \"worker-3\" has 2 slot(s)"));
  CHECK(contains(error_of([&] { select_hosts(all, "", "worker-1@worker-2@worker-3", std::nullopt, std::nullopt); }),
                 "no host is left"));
}

TEST_CASE("hosts launch: the plan gives every node the same ranks, the master and its devices") {
  TempDir dir;
  std::ofstream(dir.file("hosts")) << kHostfile;
  LaunchConfig config;
  config.hosts.method = "ssh";
  config.hosts.hostfile = dir.file("hosts");

  CHECK(contains(error_of([&] { plan_hosts(config, {}, {}); }),
                 "the hosts have different numbers of slots (worker-1 4, worker-2 4, worker-3 2)"));
  HostsPlan plan = plan_hosts(config, {std::nullopt, 2}, {});  // --num_gpus 2
  CHECK(plan.hosts.size() == 3);
  CHECK(plan.node_config.nnodes == 3);
  CHECK(plan.node_config.nproc_per_node == 2);
  CHECK(plan.node_config.master_addr == "worker-1");  // the first host, unless given
  CHECK(plan.node_config.hosts.method == "local");   // each node's launcher starts its own ranks
  CHECK(plan.node_config.tag_output);
  CHECK(plan.node_config.node_devices.empty());       // slots 0..n-1: CUDA_VISIBLE_DEVICES untouched

  config.hosts.include = "worker-1:1,3@worker-2:0,1";
  config.master_addr = "10.0.0.5";
  plan = plan_hosts(config, {}, {});
  CHECK(plan.node_config.master_addr == "10.0.0.5");
  CHECK(plan.node_config.node_devices == std::vector<std::string>{"1,3", "0,1"});

  // Under SLURM: the allocation's nodes, its first host as the master (nodelist ranges expanded).
  LaunchConfig slurm;
  slurm.hosts.method = "slurm";
  slurm.nproc_per_node = 4;
  plan = plan_hosts(slurm, {}, {"SLURM_JOB_NUM_NODES=3", "SLURM_JOB_NODELIST=gpu[07-09]"});
  CHECK(plan.node_config.nnodes == 3);
  CHECK(plan.node_config.nproc_per_node == 4);
  CHECK(plan.node_config.master_addr == "gpu07");
  CHECK(contains(error_of([&] { plan_hosts(slurm, {}, {}); }), "runs inside a SLURM allocation"));
}

TEST_CASE("hosts launch: the prefixes' variables and the env file are forwarded to every host") {
  TempDir dir;
  std::ofstream(dir.file("env")) << "# set on every host\nexport NCCL_IB_DISABLE=1\nFOO=a=b\n\nPATH=/opt/bin:/usr/bin\n";
  LaunchHostsConfig hosts;
  hosts.env_file = dir.file("env");
  std::string used;
  EnvironmentList env = forwarded_environment(
      hosts, {"NCCL_DEBUG=INFO", "NCCL_IB_DISABLE=0", "PYTHONPATH=/src", "HOME=/root", "GLOO_SOCKET_IFNAME=eth0"}, "",
      &used);
  CHECK(used == dir.file("env"));
  CHECK(env == EnvironmentList{{"FOO", "a=b"},
                               {"GLOO_SOCKET_IFNAME", "eth0"},
                               {"NCCL_DEBUG", "INFO"},
                               {"NCCL_IB_DISABLE", "1"},  // the file wins
                               {"PATH", "/opt/bin:/usr/bin"},
                               {"PYTHONPATH", "/src"}});

  // No env file named: ~/.deepspeed_env, as DeepSpeed reads it.
  std::ofstream(dir.file(".deepspeed_env")) << "FROM_DS=1\n";
  hosts.env_file.clear();
  hosts.export_prefixes = {};
  env = forwarded_environment(hosts, {"NCCL_DEBUG=INFO"}, dir.path, &used);
  CHECK(used == dir.file(".deepspeed_env"));
  CHECK(env == EnvironmentList{{"FROM_DS", "1"}});

  std::ofstream(dir.file("bad")) << "A=1\njust words\n";
  hosts.env_file = dir.file("bad");
  CHECK(contains(error_of([&] { forwarded_environment(hosts, {}, ""); }),
                 dir.file("bad") + ":2: expected NAME=VALUE, found \"just words\""));
}

TEST_CASE("hosts launch: a host's command line, run by a real shell, starts its node's ranks") {
  // What ssh hands the host's shell: quoting must survive spaces, quotes and $ in every part.
  LaunchConfig node;
  node.nnodes = 2;
  node.nproc_per_node = 2;
  node.master_addr = "10.0.0.1";
  node.master_port = 29571;
  node.tag_output = true;
  node.env = {{"FROM_CONFIG", "it's $HOME"}};
  node.node_devices = {"0,1", "2,3"};
  std::string line = node_command_line(node, "1", {{"FORWARDED", "a b 'c' $d"}}, TESSERA_SOURCE_DIR, TESSERA_CLI_PATH,
                                       {"sh", "-c", "echo \"$RANK/$WORLD_SIZE node=$GROUP_RANK cuda=$CUDA_VISIBLE_DEVICES "
                                                    "fwd=$FORWARDED cfg=$FROM_CONFIG pwd=$(pwd) arg=$0\"",
                                        "x y"});
  auto r = tessera::testing::run({"sh", "-c", line}, {}, 30);
  INFO(line);
  INFO(r.output);
  CHECK(r.status == 0);
  const std::string common = std::string(" node=1 cuda=2,3 fwd=a b 'c' $d cfg=it's $HOME pwd=") + TESSERA_SOURCE_DIR +
                             " arg=x y\n";
  CHECK(contains(r.output, "[rank2]: 2/4" + common));
  CHECK(contains(r.output, "[rank3]: 3/4" + common));
  CHECK(shell_quote("plain-word_1.2") == "plain-word_1.2");
  CHECK(shell_quote("") == "''");
  CHECK(shell_quote("it's") == "'it'\\''s'");
}
