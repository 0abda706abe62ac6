// Runs a program for a test: extra environment, combined stdout+stderr captured, a wall-clock
// limit after which the whole process group is killed (so a hung test fails instead of hanging).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace tessera::testing {

struct RunResult {
  int status = -1;        // exit status, or 128 + signal
  bool timed_out = false;
  double seconds = 0;
  std::string output;     // stdout and stderr, interleaved
};

RunResult run(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {},
              double timeout_s = 60);

// Starts without waiting; finish() collects it.
struct Started {
  int pid = -1;
  int output_fd = -1;
  double started_at = 0;
};
Started start(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {});
RunResult finish(const Started& s, double timeout_s = 60);

bool contains(const std::string& text, const std::string& part);

// A file's bytes ("" when it cannot be read): runs' dumps compared byte for byte.
std::string read_file(const std::string& path);

// A fresh directory for one test's files, removed with its (flat) contents at the end of the test.
// Plain POSIX calls: std::filesystem::remove_all resolves to a broken copy exported by libtorch.so
// in the torch 2.11 wheel (it crashes).
struct TempDir {
  std::string path;
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return path + "/" + name; }
};

// A TCP port on 127.0.0.1 that nothing listens on now, chosen by the OS (for --master-port), so
// tests can run in parallel (ctest -j2) without two of them meeting on one port.
int free_port();

}  // namespace tessera::testing
