// Runs of the engine tests' worker (tests/workers/engine_worker.cpp) through `tessera launch`: one
// case, or several in one launch (the worker's --then runs them in turn on one process group; most
// of a small case's time is its processes' start), each case's output apart.
#pragma once

#include <map>
#include <regex>
#include <string>
#include <vector>

#include "tests/subprocess.h"

namespace tessera::testing::engine_worker {

inline RunResult train(int ranks, const std::vector<std::string>& args, const std::map<std::string, std::string>& env = {}) {
  std::vector<std::string> argv = {TESSERA_CLI_PATH, "launch", "--nproc-per-node", std::to_string(ranks),
                                   "--master-port", std::to_string(free_port()), "--timeout", "60", "--",
                                   TESSERA_ENGINE_WORKER_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv, env, 180);
}

// What each case of a --then run printed (rank 0's "case N:" lines open them).
inline std::vector<std::string> case_outputs(const std::string& output) {
  static const std::regex opening("(^|\\n)case \\d+:\\n");
  std::vector<size_t> starts;
  for (std::sregex_iterator it(output.begin(), output.end(), opening), end; it != end; ++it)
    starts.push_back(size_t(it->position() + it->length()));
  std::vector<std::string> cases;
  for (size_t i = 0; i < starts.size(); ++i)
    cases.push_back(output.substr(starts[i], (i + 1 < starts.size() ? starts[i + 1] : output.size()) - starts[i]));
  return cases;
}

struct CaseRuns {
  int status = -1;
  std::string output;                // the whole launch's
  std::vector<std::string> outputs;  // each case's, in order (fewer when one failed)
};

// `cases` in one launch on `ranks` ranks; a failing case ends the launch there.
inline CaseRuns train_cases(int ranks, const std::vector<std::vector<std::string>>& cases,
                            const std::map<std::string, std::string>& env = {}) {
  std::vector<std::string> args;
  for (const auto& c : cases) {
    if (!args.empty()) args.push_back("--then");
    args.insert(args.end(), c.begin(), c.end());
  }
  RunResult r = train(ranks, args, env);
  return {r.status, r.output, cases.size() > 1 ? case_outputs(r.output) : std::vector<std::string>{r.output}};
}

}  // namespace tessera::testing::engine_worker
