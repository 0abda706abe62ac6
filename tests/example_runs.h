// Running the example programs from tests: launch one through the tessera CLI, and read what it
// prints (final loss, progress lines) and writes (--save-parameters).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <regex>
#include <string>
#include <vector>

#include "subprocess.h"

namespace tessera::testing::examples {

inline double final_loss(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex("final loss: ([0-9.]+)"))) return -1;
  return std::stod(m[1]);
}

// The gradient norms of the progress lines (every steps_per_print steps): Adam hides a gradient
// off by a constant factor from the losses and parameters, the norm does not.
inline std::vector<double> grad_norms(const std::string& output) {
  std::vector<double> norms;
  static const std::regex norm("grad norm ([0-9.]+)");
  for (std::sregex_iterator it(output.begin(), output.end(), norm), end; it != end; ++it) norms.push_back(std::stod((*it)[1]));
  return norms;
}

inline bool same_norms(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.empty() || a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::abs(a[i] - b[i]) > 1e-3 * b[i]) return false;  // printed to 4 decimals
  return true;
}

inline tessera::testing::RunResult run_example(const char* program, int ranks, const std::string& config, int steps,
                                        int port, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv{TESSERA_CLI_PATH, "launch", "--nproc-per-node", std::to_string(ranks),
                                "--master-port", std::to_string(port), "--", program, "--config", config, "--steps",
                                std::to_string(steps)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return tessera::testing::run(argv, {}, 300);
}

// A --save-parameters file: every parameter's single-device values, float32, in order.
inline std::vector<float> read_parameters(const std::string& path) {
  std::vector<float> values;
  if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
    float buffer[4096];
    for (size_t n; (n = std::fread(buffer, sizeof(float), 4096, f)) > 0;) values.insert(values.end(), buffer, buffer + n);
    std::fclose(f);
  }
  return values;
}

// The largest |a - b| over every parameter (infinity when the files differ in length or are missing).
inline double max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.empty() || a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
  return worst;
}

}  // namespace tessera::testing::examples
