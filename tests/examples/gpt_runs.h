// The example GPT's runs that the train_gpt tests compare (tests/examples/test_examples_training.cpp,
// test_examples_moe.cpp): its DeepSpeed config, the small model the parity runs use, and the
// tolerance on parameters against a 1-rank run.
#pragma once

#include <string>
#include <vector>

#include "tests/example_runs.h"
#include "tests/subprocess.h"

namespace tessera::testing::examples {

inline std::string gpt_config(int micro, int stage, int accumulation = 1) {
  return R"({"train_micro_batch_size_per_gpu": )" + std::to_string(micro) +
         R"(, "gradient_accumulation_steps": )" + std::to_string(accumulation) + R"(, "steps_per_print": 5,
             "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
             "zero_optimization": {"stage": )" + std::to_string(stage) +
         // ZeRO-3: every tensor partitioned and each block released after use (the model is small)
         (stage == 3 ? R"(, "stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0,
                          "stage3_max_live_parameters": 300000, "stage3_prefetch_bucket_size": 200000)" : "") + "}}";
}

// gpt_config with more top-level sections (JSON members without the braces).
inline std::string with_sections(const std::string& config, const std::string& sections) {
  return config.substr(0, config.size() - 1) + ", " + sections + "}";
}

// The model of the runs compared with a reference: the example GPT at width 64 and 64 tokens a
// sequence (4 blocks, 4 heads, 220,544 parameters) rather than its default 128 x 128. Every layout
// needs the same of it (heads for tp 4 and Ulysses cp 4, 8 chunks for ring cp 4); each run costs
// about a quarter less, most of what is left the processes' start.
inline const std::vector<std::string> kParityModel = {"--n-embd", "64", "--seq-len", "64"};

// train_gpt on `ranks` ranks with the parity model (flags after it may override it).
inline tessera::testing::RunResult run_gpt(int ranks, const std::string& config, int steps, int port,
                                           const std::vector<std::string>& flags = {}) {
  std::vector<std::string> all = kParityModel;
  all.insert(all.end(), flags.begin(), flags.end());
  return run_example(TESSERA_TRAIN_GPT_PATH, ranks, config, steps, port, all);
}

// Parameters after 10 AdamW steps agree to this with the 1-rank run's: the reductions sum in
// another order, and Adam turns last-bit differences of tiny gradients into moves of up to lr
// (1e-3); a wrong gradient moves them by that much on every step. Measured: 1.5e-5 on 2 data-
// parallel ranks, 2-4.4e-5 with tensor parallelism.
constexpr double kParameterTolerance = 1e-4;

}  // namespace tessera::testing::examples
