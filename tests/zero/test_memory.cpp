// Peak process memory of ZeRO stages 1 and 2 against the accounting (zero/buffer_plan.h,
// docs/zero.md). Two ranks train a ~50M-parameter deep MLP (tests/workers/engine_worker.cpp --rss), one
// process per stage and dtype; each rank's peak resident set size at stage s minus stage 0's must
// equal the planner's difference in bytes within max(5%, 32 MiB). This measures the process, not
// the engine's counters: a transient buffer anywhere (a receive chunk, a clone before an allgather,
// a backend's copy) shows up here.
//
// The workers run tessera's large-block allocator with no cache (TESSERA_CPU_BLOCK_CACHE_MIB=0,
// csrc/cpu_block_cache.h), installed before the model is built: every block of 128 KiB or more is
// unmapped when freed, so the peak is what was live, not what glibc's heap or the cache kept (both
// differ by rank and run). Measured within 4–9 MiB of the accounting on every rank.
#include <catch2/catch.hpp>

#include <regex>
#include <vector>

#include "tests/subprocess.h"
#include "zero/buffer_plan.h"


namespace {

constexpr int kHidden = 1024, kLayers = 48, kBucket = 4000000;

// The plan of the worker's DeepMlp: weights [H×16, layers × H×H, 8×H] and biases [(layers+1) × H].
tessera::BufferPlan plan_of(int stage, const std::string& dtype) {
  tessera::BufferPlanInput in;
  std::vector<int64_t> weights = {int64_t(kHidden) * 16}, biases;
  for (int l = 0; l < kLayers; ++l) weights.push_back(int64_t(kHidden) * kHidden);
  weights.push_back(8 * kHidden);
  for (int l = 0; l <= kLayers; ++l) biases.push_back(kHidden);
  in.group_numels = {weights, biases};
  in.stage = stage;
  in.data_parallel = 2;
  in.compute_bytes = dtype == "fp32" ? 4 : 2;
  in.bucket_numel = kBucket;
  in.state_floats = 2;  // AdamW
  in.backend_copies_reductions = true;  // Gloo
  return tessera::plan_buffers(in);
}

int64_t accounted(const tessera::BufferPlan& p) {
  return p.parameter_bytes + p.master_bytes + p.gradient_bytes + p.state_bytes + p.communication_bytes;
}

std::vector<int64_t> peak_rss(int stage, const std::string& dtype) {
  auto r = tessera::testing::run(
      {TESSERA_CLI_PATH, "launch", "--nproc-per-node", "2", "--master-port",
       std::to_string(tessera::testing::free_port()), "--timeout", "60", "--", TESSERA_ENGINE_WORKER_PATH, "--rss",
       "--stage", std::to_string(stage), "--dtype", dtype, "--hidden", std::to_string(kHidden), "--layers",
       std::to_string(kLayers), "--mb", "2", "--steps", "3", "--bucket", std::to_string(kBucket)},
      {{"TESSERA_CPU_BLOCK_CACHE_MIB", "0"}}, 240);
  INFO(r.output);
  REQUIRE(r.status == 0);
  std::smatch m;
  const std::string pattern = "peak rss stage " + std::to_string(stage) + " dtype " + dtype + ": (\\d+) (\\d+)";
  REQUIRE(std::regex_search(r.output, m, std::regex(pattern)));
  std::printf("%s\n", m[0].str().c_str());
  return {std::stoll(m[1]), std::stoll(m[2])};
}

}  // namespace

TEST_CASE("peak RSS of ZeRO 1 and 2 falls from stage 0 by the accounting (2 ranks - 50M params - fp32 and bf16)") {
  for (std::string dtype : {"fp32", "bf16"}) {
    const std::vector<int64_t> base = peak_rss(0, dtype);
    const int64_t base_accounted = accounted(plan_of(0, dtype));
    for (int stage : {1, 2}) {
      const std::vector<int64_t> peak = peak_rss(stage, dtype);
      const int64_t expected = accounted(plan_of(stage, dtype)) - base_accounted;  // negative: a saving
      const double tolerance = std::max(0.05 * double(-expected), 32.0 * (1 << 20));
      for (int rank = 0; rank < 2; ++rank) {
        const int64_t measured = peak[rank] - base[rank];
        std::printf("%s stage %d rank %d: peak RSS minus stage 0's %.1f MiB, accounting %.1f MiB\n", dtype.c_str(),
                    stage, rank, measured / 1048576.0, expected / 1048576.0);
        INFO(dtype << " stage " << stage << " rank " << rank << ": measured " << measured << " bytes, accounting "
                   << expected);
        CHECK(std::abs(double(measured - expected)) <= tolerance);
      }
    }
  }
}
