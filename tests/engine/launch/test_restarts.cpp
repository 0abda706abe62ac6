// `tessera launch --max-restarts N` and `--hang-timeout S` (engine/launch/restarts.h, the
// supervisor's heartbeat check): a failed attempt starts every rank again with the restart's
// variables, the limit ends the job with the last failure's status, and a rank whose heartbeat
// file goes stale is a hang. The ranks are `sh -c` scripts; the training side (checkpoint.
// auto_resume, the engine's heartbeat) is tests/python/launch/test_restarts.py's.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <iterator>

#include "engine/launch/launch_config.h"
#include "engine/launch/restarts.h"
#include "tests/subprocess.h"

using namespace tessera;
using tessera::testing::contains;

namespace {

std::vector<std::string> launch_argv(std::vector<std::string> options, const std::string& script) {
  std::vector<std::string> argv = {TESSERA_CLI_PATH, "launch"};
  argv.insert(argv.end(), options.begin(), options.end());
  argv.insert(argv.end(), {"--", "sh", "-c", script});
  return argv;
}

int count(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("restarts: a rank that fails once is started again with every other, and learns why") {
  // Rank 1 fails on the first attempt only; the second prints what its ranks were told.
  auto r = tessera::testing::run(
      launch_argv({"--nproc-per-node", "2", "--max-restarts", "2"},
                  "if [ -z \"$TESSERA_RESTART_COUNT\" ]; then [ \"$RANK\" = 1 ] && exit 3; exec sleep 30; fi; "
                  "echo \"rank $RANK attempt $TESSERA_RESTART_COUNT/$TORCHELASTIC_RESTART_COUNT of "
                  "$TORCHELASTIC_MAX_RESTARTS: $TESSERA_RESTART_REASON\""),
      {}, 60);
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(r.seconds < 20);  // rank 0's sleep was stopped, not waited for
  const std::string why = "rank 1 (local rank 1) exited with status 3; stopped the other 1 rank(s)";
  CHECK(contains(r.output, "tessera launch: restart 1 of 2: every rank starts again (" + why + ")\n"));
  CHECK(contains(r.output, "rank 0 attempt 1/1 of 2: " + why + "\n"));
  CHECK(contains(r.output, "rank 1 attempt 1/1 of 2: " + why + "\n"));
  CHECK(!contains(r.output, "restart 2"));
}

TEST_CASE("restarts: the limit ends the job with the last failure's status - without restarts the first failure ends it") {
  auto r = tessera::testing::run(launch_argv({"--nproc-per-node", "2", "--max-restarts", "2"},
                                             "[ \"$RANK\" = 0 ] && exit $((5 + ${TESSERA_RESTART_COUNT:-0})); exec sleep 30"),
                                 {}, 60);
  INFO(r.output);
  CHECK(r.status == 7);  // the third attempt's
  CHECK(count(r.output, "tessera launch: rank 0 (local rank 0) exited with status") == 3);
  CHECK(contains(r.output, "restart 2 of 2"));
  CHECK(contains(r.output, "tessera launch: the restart limit (max_restarts 2) is reached: the job ends with status 7\n"));
  auto once = tessera::testing::run(launch_argv({"--nproc-per-node", "1"}, "exit 4"), {}, 30);
  CHECK(once.status == 4);
  CHECK(!contains(once.output, "restart"));
}

TEST_CASE("hang detection: a rank whose heartbeat goes stale fails the job - before its first beat it is not watched") {
  tessera::testing::TempDir dir;
  // Rank 0 beats once and stops; rank 1 never beats. The directory of heartbeat files is the
  // launcher's own and goes with it.
  auto r = tessera::testing::run(
      launch_argv({"--nproc-per-node", "2", "--hang-timeout", "1"},
                  "echo \"$TESSERA_HEARTBEAT_FILE\" > " + dir.file("where") + ".$RANK; "
                  "[ \"$RANK\" = 0 ] && touch \"$TESSERA_HEARTBEAT_FILE\"; exec sleep 30"),
      {}, 60);
  INFO(r.output);
  CHECK(r.status == kHangStatus);
  CHECK(r.seconds < 10);
  CHECK(contains(r.output, "tessera launch: rank 0 (local rank 0) made no progress for "));
  CHECK(contains(r.output, " s (no optimizer step; hang_timeout_s 1): hung; stopped the other 1 rank(s)"));
  std::ifstream where(dir.file("where") + ".0");
  std::string file;
  std::getline(where, file);
  REQUIRE(!file.empty());
  struct stat st {};
  CHECK(::stat(file.substr(0, file.rfind('/')).c_str(), &st) != 0);  // removed with its files

  // Ranks that keep beating (every 0.2 s for 3 s, against a 1 s timeout) are not hung.
  auto alive = tessera::testing::run(
      launch_argv({"--nproc-per-node", "2", "--hang-timeout", "1"},
                  "i=0; while [ $i -lt 15 ]; do touch \"$TESSERA_HEARTBEAT_FILE\"; sleep 0.2; i=$((i + 1)); done"),
      {}, 60);
  INFO(alive.output);
  CHECK(alive.status == 0);
}

TEST_CASE("restarts: the launch config's keys and flags, and an elastic node count without a hostfile") {
  ConfigReport report;
  LaunchConfig c = parse_launch_config(nlohmann::json::parse(R"({"max_restarts": 3, "hang_timeout_s": 30})"), report);
  CHECK(report.ok());
  CHECK(c.max_restarts == 3);
  CHECK(c.hang_timeout_s == 30);
  ConfigReport bad;
  parse_launch_config(nlohmann::json::parse(R"({"max_restarts": -1, "hang_timeout_s": -2, "nnodes": 2, "min_nnodes": 3})"), bad);
  CHECK(contains(bad.errors(), "max_restarts: found -1"));
  CHECK(contains(bad.errors(), "hang_timeout_s: found -2"));
  CHECK(contains(bad.errors(), "min_nnodes: found 3, expected at most nnodes (2)"));
  auto r = tessera::testing::run(launch_argv({"--nnodes", "1:2", "--max-restarts", "1"}, "true"), {}, 30);
  INFO(r.output);
  CHECK(r.status != 0);
  CHECK(contains(r.output, "min_nnodes: an elastic node count (--nnodes MIN:MAX) needs a hostfile launch"));
  auto fixed = tessera::testing::run(launch_argv({"--nnodes", "1:1"}, "true"), {}, 30);
  CHECK(fixed.status == 0);  // MIN = MAX: not elastic
}

TEST_CASE("restarts: run_with_restarts stops at a success, an interrupt, a final attempt or the limit") {
  std::vector<std::string> reasons;
  auto attempts = [&](std::vector<JobEnd> ends) {
    reasons.clear();
    return [&reasons, ends](int count, const std::string& reason) {
      reasons.push_back(reason);
      return ends.at(static_cast<size_t>(count));
    };
  };
  CHECK(run_with_restarts(5, attempts({{1, false, "a"}, {2, false, "b"}, {0, false, ""}})) == 0);
  CHECK(reasons == std::vector<std::string>{"", "a", "b"});
  CHECK(run_with_restarts(5, attempts({{1, false, "a"}, {130, true, "interrupted"}})) == 130);
  CHECK(reasons.size() == 2);
  CHECK(run_with_restarts(5, attempts({{1, false, "a"}, {1, false, "too few hosts", true}})) == 1);
  CHECK(reasons.size() == 2);
  CHECK(run_with_restarts(1, attempts({{3, false, "a"}, {4, false, "b"}})) == 4);
  CHECK(reasons.size() == 2);
  const auto env = restart_environment(2, 1, "why");
  CHECK(env.at("TESSERA_RESTART_COUNT") == "1");
  CHECK(env.at("TORCHELASTIC_RESTART_COUNT") == "1");
  CHECK(env.at("TESSERA_RESTART_REASON") == "why");
  CHECK(env.at("TORCHELASTIC_MAX_RESTARTS") == "2");
  CHECK(restart_environment(2, 0, "").count("TESSERA_RESTART_COUNT") == 0);
}
