// `tessera launch`: the environment each rank gets, tagged output, stopping every rank when one
// fails or the launcher is told to stop, and the launch config's parsing and errors.
// The ranks are `sh -c` scripts, so each test takes a second or less.
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <thread>

#include "engine/launch/launch_config.h"
#include "engine/launch/launcher.h"
#include "tests/subprocess.h"

using namespace tessera;
using tessera::testing::contains;

namespace {

using tessera::testing::TempDir;

void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// Waits for a rank's script to write its pid ("$$") into `path`.
pid_t wait_for_pid(const std::string& path, double timeout_s = 10) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    std::ifstream in(path);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!text.empty() && text.back() == '\n') return static_cast<pid_t>(std::stol(text));
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// True once no process has this pid (the launcher reaps its ranks before it returns; the short
// retry only absorbs scheduling).
bool process_gone(pid_t pid) {
  for (int i = 0; i < 100; ++i) {
    if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

std::vector<std::string> launch_argv(std::vector<std::string> options, const std::string& script) {
  // `env -u`: the default OMP_NUM_THREADS must not depend on the test's own environment.
  std::vector<std::string> argv = {"env", "-u", "OMP_NUM_THREADS", TESSERA_CLI_PATH, "launch"};
  argv.insert(argv.end(), options.begin(), options.end());
  argv.insert(argv.end(), {"--", "sh", "-c", script});
  return argv;
}

}  // namespace

TEST_CASE("launch: each rank gets torchrun's environment and tag_output prefixes every line") {
  auto r = tessera::testing::run(
      launch_argv({"--nproc-per-node", "2", "--master-port", "29561", "--tag-output"},
                  "echo \"rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK/$LOCAL_WORLD_SIZE group=$GROUP_RANK "
                  "port=$MASTER_PORT addr=$MASTER_ADDR omp=$OMP_NUM_THREADS timeout=$TESSERA_TIMEOUT_S\"; "
                  "echo on-stderr >&2; printf unfinished"),
      {}, 30);
  INFO(r.output);
  CHECK(r.status == 0);
  for (std::string rank : {"0", "1"}) {
    std::string tag = "[rank" + rank + "]: ";
    CHECK(contains(r.output, tag + "rank=" + rank + " world=2 local=" + rank +
                                 "/2 group=0 port=29561 addr=127.0.0.1 omp=1 timeout=300\n"));
    CHECK(contains(r.output, tag + "on-stderr\n"));
    CHECK(contains(r.output, tag + "unfinished\n"));  // a last line without newline still comes out whole
  }
}

TEST_CASE("launch: DeepSpeed's --num_gpus and --num_nodes are the ranks per node and the nodes") {
  auto r = tessera::testing::run(
      launch_argv({"--num_gpus", "2", "--num_nodes", "2", "--node_rank", "1", "--master_port", "29564"},
                  "echo \"rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK node=$GROUP_RANK\""),
      {}, 30);
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(contains(r.output, "rank=2 world=4 local=0 node=1\n"));
  CHECK(contains(r.output, "rank=3 world=4 local=1 node=1\n"));
}

TEST_CASE("launch: flags override the config file and env and omp_num_threads reach the ranks") {
  TempDir dir;
  write_file(dir.file("launch.json"),
             R"({"nproc_per_node": 3, "master_port": 29562, "omp_num_threads": 3, "timeout_s": 2.5,
                 "env": {"EXTRA": "from-config"}})");
  auto r = tessera::testing::run(
      launch_argv({"--config", dir.file("launch.json"), "--nproc-per-node", "2"},
                  "echo \"rank=$RANK world=$WORLD_SIZE port=$MASTER_PORT omp=$OMP_NUM_THREADS "
                  "timeout=$TESSERA_TIMEOUT_S extra=$EXTRA\""),
      {}, 30);
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(contains(r.output, "rank=1 world=2 port=29562 omp=3 timeout=2.5 extra=from-config\n"));
  CHECK_FALSE(contains(r.output, "[rank"));  // no tagging unless asked
  CHECK_FALSE(contains(r.output, "rank=2"));

  // The launcher's own OMP_NUM_THREADS is passed on rather than replaced by 1.
  auto inherited = tessera::testing::run({TESSERA_CLI_PATH, "launch", "--nproc-per-node", "2", "--", "sh", "-c",
                                          "echo omp=$OMP_NUM_THREADS"},
                                         {{"OMP_NUM_THREADS", "5"}}, 30);
  CHECK(inherited.status == 0);
  CHECK(contains(inherited.output, "omp=5\nomp=5\n"));
}

TEST_CASE("launch: a failing rank stops the others and its status becomes the launcher's") {
  TempDir dir;
  std::string pid_file = dir.file("pid0");
  // Rank 1 fails only once rank 0 is surely running (has written its pid).
  auto r = tessera::testing::run(
      launch_argv({"--nproc-per-node", "2", "--grace-period", "5"},
                  "if [ \"$RANK\" = 1 ]; then while [ ! -s " + pid_file + " ]; do sleep 0.05; done; exit 7; fi; "
                  "echo $$ > " + pid_file + ".tmp && mv " + pid_file + ".tmp " + pid_file + "; exec sleep 60"),
      {}, 60);
  INFO(r.output);
  CHECK(r.status == 7);
  CHECK(r.seconds < 15);
  CHECK(contains(r.output, "tessera launch: rank 1 (local rank 1) exited with status 7; stopped the other 1 rank(s)\n"));
  pid_t sleeper = wait_for_pid(pid_file, 0);
  REQUIRE(sleeper > 0);
  CHECK(process_gone(sleeper));
}

TEST_CASE("launch: a rank that ignores SIGTERM is killed after the grace period") {
  TempDir dir;
  std::string pid_file = dir.file("pid0");
  // `trap '' TERM` is inherited through exec: the sleep ignores SIGTERM.
  auto r = tessera::testing::run(
      launch_argv({"--nproc-per-node", "2", "--grace-period", "0.3"},
                  "if [ \"$RANK\" = 1 ]; then while [ ! -s " + pid_file + " ]; do sleep 0.05; done; kill -KILL $$; fi; "
                  "trap '' TERM; echo $$ > " + pid_file + ".tmp && mv " + pid_file + ".tmp " + pid_file +
                      "; exec sleep 60"),
      {}, 60);
  INFO(r.output);
  CHECK(r.status == 128 + SIGKILL);
  CHECK(r.seconds < 15);
  CHECK(contains(r.output, "rank 1 (local rank 1) was killed by signal 9"));
  CHECK(contains(r.output, "stopped the other 1 rank(s) (1 killed after the 0.3 s grace period)"));
  pid_t sleeper = wait_for_pid(pid_file, 0);
  REQUIRE(sleeper > 0);
  CHECK(process_gone(sleeper));
}

TEST_CASE("launch: SIGTERM to the launcher stops every rank and exits 143") {
  TempDir dir;
  auto started = tessera::testing::start(launch_argv(
      {"--nproc-per-node", "2"},
      "echo $$ > " + dir.path + "/pid$RANK.tmp && mv " + dir.path + "/pid$RANK.tmp " + dir.path + "/pid$RANK; "
      "exec sleep 60"));
  pid_t rank0 = wait_for_pid(dir.file("pid0")), rank1 = wait_for_pid(dir.file("pid1"));
  REQUIRE(rank0 > 0);
  REQUIRE(rank1 > 0);
  ::kill(started.pid, SIGTERM);
  auto r = tessera::testing::finish(started, 30);
  INFO(r.output);
  CHECK(r.status == 143);
  CHECK(contains(r.output, "tessera launch: interrupted by signal 15"));
  CHECK(contains(r.output, "stopped 2 rank(s)"));
  CHECK(process_gone(rank0));
  CHECK(process_gone(rank1));
}

TEST_CASE("launch: a program that cannot run or none at all is a clear error") {
  auto missing = tessera::testing::run({TESSERA_CLI_PATH, "launch", "--nproc-per-node", "2", "--",
                                        "/nonexistent/tessera-program"},
                                       {}, 30);
  CHECK(missing.status == 127);
  CHECK(contains(missing.output, "could not run '/nonexistent/tessera-program': No such file or directory"));

  auto none = tessera::testing::run({TESSERA_CLI_PATH, "launch", "--nproc-per-node", "2"}, {}, 30);
  CHECK(none.status != 0);
  CHECK(contains(none.output, "no program given"));

  auto bad_flag = tessera::testing::run({TESSERA_CLI_PATH, "launch", "--nproc-per-node", "0", "--", "true"}, {}, 30);
  CHECK(bad_flag.status != 0);
  CHECK(contains(bad_flag.output, "nproc_per_node: found 0, expected a value >= 1"));
}

TEST_CASE("launch config: a good file and defaults") {
  TempDir dir;
  write_file(dir.file("launch.json"), R"({
    // comments are allowed, as in the training config
    "nproc_per_node": 4, "nnodes": 2, "node_rank": 1,
    "master_addr": "10.0.0.1", "master_port": 1234,
    "omp_num_threads": 2, "tag_output": true, "grace_period_s": 1.5, "timeout_s": 60,
    "env": {"NCCL_DEBUG": "INFO"},
    "hosts": {"method": "local"}
  })");
  LaunchConfig c = load_launch_config(dir.file("launch.json"));
  CHECK(c.nproc_per_node == 4);
  CHECK(c.world_size() == 8);
  CHECK(c.node_rank == 1);
  CHECK(c.master_addr == "10.0.0.1");
  CHECK(c.master_port == 1234);
  CHECK(c.omp_num_threads == 2);
  CHECK(c.tag_output);
  CHECK(c.grace_period_s == 1.5);
  CHECK(c.timeout_s == 60);
  CHECK(c.env.at("NCCL_DEBUG") == "INFO");
  CHECK(c.hosts.method == "local");

  auto env = rank_environment(c, 3);
  auto has = [&](const std::string& kv) { return std::find(env.begin(), env.end(), kv) != env.end(); };
  CHECK(has("RANK=7"));
  CHECK(has("LOCAL_RANK=3"));
  CHECK(has("WORLD_SIZE=8"));
  CHECK(has("LOCAL_WORLD_SIZE=4"));
  CHECK(has("GROUP_RANK=1"));
  CHECK(has("ROLE_RANK=7"));
  CHECK(has("MASTER_ADDR=10.0.0.1"));
  CHECK(has("OMP_NUM_THREADS=2"));
  CHECK(has("TESSERA_TIMEOUT_S=60"));
  CHECK(has("NCCL_DEBUG=INFO"));

  LaunchConfig d = load_launch_config("");
  CHECK(d.nproc_per_node == 1);
  CHECK(d.master_addr.empty());  // 127.0.0.1 on one node, the first host with a hostfile
  CHECK(d.master_address() == "127.0.0.1");
  CHECK(d.master_port == 29500);
  CHECK_FALSE(d.omp_num_threads.has_value());
  CHECK(d.grace_period_s == 5);
  CHECK(d.timeout_s == 300);

  // Overrides (the command-line flags) win over the file's keys.
  CHECK(load_launch_config(R"({"nproc_per_node": 3})", {{"nproc_per_node", 2}}).nproc_per_node == 2);
}

TEST_CASE("launch config: every error names its JSON path") {
  auto error_of = [](const std::string& text, nlohmann::json overrides = nlohmann::json::object()) {
    try {
      load_launch_config(text, overrides);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string e = error_of(R"({"hosts": {"method": "pigeon"}, "master_port": 70000, "nproc_per_nod": 2,
                               "tag_output": "yes", "env": {"A": 1}})");
  CHECK(contains(e, "error: hosts.method: found \"pigeon\", expected one of \"local\", \"ssh\", \"pdsh\", \"slurm\""));
  CHECK(contains(e, "error: master_port: found 70000, expected a value in [1, 65535]"));
  CHECK(contains(e, "error: nproc_per_nod: unknown key; did you mean \"nproc_per_node\"?"));
  CHECK(contains(e, "error: tag_output: found \"yes\", expected true or false"));
  CHECK(contains(e, "error: env.A: found 1, expected a string"));

  CHECK(contains(error_of(R"({"hosts": {"method": "pdsh"}})"),
                 "error: hosts.hostfile: found \"\", expected the path of a hostfile"));
  CHECK(contains(error_of(R"({"hosts": {"include": "a", "exclude": "b"}})"),
                 "error: hosts.exclude: cannot be used with hosts.include"));
  CHECK(contains(error_of(R"({"nnodes": 2, "node_devices": ["0,1"]})"),
                 "error: node_devices: found 1 entries, expected one per node (nnodes = 2)"));
  CHECK(contains(error_of(R"({"nnodes": 2, "node_rank": 2})"), "error: node_rank: found 2, expected a value < nnodes (2)"));
  CHECK(contains(error_of(R"({"env": {"RANK": "3"}})"), "error: env.RANK: set by the launcher"));
  CHECK(contains(error_of(R"({"env": {"OMP_NUM_THREADS": "3"}})"), "set \"omp_num_threads\" instead"));
  CHECK(contains(error_of(R"({"grace_period_s": -1, "timeout_s": 0})"), "grace_period_s: found -1"));
  TempDir dir;
  write_file(dir.file("list.json"), "[1, 2]");
  CHECK(contains(error_of(dir.file("list.json")), "the launch config must be a JSON object"));
  CHECK(contains(error_of(R"({"nproc_per_node": 2,})"), "is not valid JSON"));
  CHECK(contains(error_of("{}", {{"master_port", 0}}), "error: master_port: found 0"));
  CHECK(contains(error_of("/nonexistent/launch.json"), "cannot read config file '/nonexistent/launch.json'"));

  // "unknown_keys": "warn" downgrades unknown keys, as in the training config.
  std::vector<std::string> warnings;
  load_launch_config(R"({"unknown_keys": "warn", "rdzv_backend": "c10d"})", nlohmann::json::object(), &warnings);
  REQUIRE(warnings.size() == 1);
  CHECK(contains(warnings[0], "rdzv_backend: unknown key"));
}

TEST_CASE("launch config: one bad key does not hide the errors of the others") {
  auto error_of = [](const std::string& text, nlohmann::json overrides = nlohmann::json::object()) {
    try {
      load_launch_config(text, overrides);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto count_errors = [](const std::string& text) {
    int n = 0;
    for (size_t at = text.find("error: "); at != std::string::npos; at = text.find("error: ", at + 1)) ++n;
    return n;
  };
  std::string e = error_of(R"({"master_port": 0, "nnodes": 2, "node_rank": 2, "env": {"RANK": "3"},
                               "hosts": {"method": "ssh"}})");
  INFO(e);
  CHECK(e.rfind("invalid launch config (inline JSON text):\n", 0) == 0);
  CHECK(count_errors(e) == 4);
  CHECK(contains(e, "error: master_port: found 0, expected a value in [1, 65535]"));
  CHECK(contains(e, "error: node_rank: found 2, expected a value < nnodes (2)"));
  CHECK(contains(e, "error: env.RANK: set by the launcher"));
  CHECK(contains(e, "error: hosts.hostfile: found \"\", expected the path of a hostfile"));
  // The same from a flag; a check on a key that failed to parse is skipped, not repeated.
  e = error_of("", {{"master_port", 0}, {"nnodes", 0}, {"node_rank", 1}});
  INFO(e);
  CHECK(count_errors(e) == 2);
  CHECK(contains(e, "error: master_port: found 0"));
  CHECK(contains(e, "error: nnodes: found 0, expected a value >= 1"));
  CHECK(e.rfind("invalid launch options:\n", 0) == 0);
}

TEST_CASE("launch config: warnings are \"<path>: <message>\" and the launcher says \"warning:\" once") {
  std::vector<std::string> warnings;
  load_launch_config(R"({"hosts": {"method": "local", "hostfile": "hosts.txt"}})", nlohmann::json::object(), &warnings);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0] == "hosts.hostfile: ignored: hosts.method is \"local\"");
  TempDir dir;
  write_file(dir.file("launch.json"), R"({"hosts": {"method": "local", "hostfile": "hosts.txt"}})");
  auto r = tessera::testing::run({TESSERA_CLI_PATH, "launch", "--config", dir.file("launch.json"), "--", "true"}, {},
                                 30);
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(contains(r.output, "tessera launch: warning: hosts.hostfile: ignored: hosts.method is \"local\""));
  CHECK_FALSE(contains(r.output, "warning: warning:"));
}

TEST_CASE("launch: the program's arguments reach the ranks verbatim") {
  auto r = tessera::testing::run({TESSERA_CLI_PATH, "launch", "--nproc-per-node", "1", "--", "sh", "-c",
                                  "for a in \"$@\"; do echo \"<$a>\"; done", "sh", "[1,2]", "{\"a\": 1, \"b\": 2}",
                                  "--", "--lr"},
                                 {}, 30);
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(contains(r.output, "<[1,2]>\n<{\"a\": 1, \"b\": 2}>\n<-->\n<--lr>\n"));
}
