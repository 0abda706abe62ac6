// The step speculated during backward (zero/speculative_step.h, offload_optimizer.super_offload).
// In process: kept when the inputs match, restored bit for bit when they do not, on cancel, and
// when a chunk's step throws. Through the engine on the GPU ranks' host path (TESSERA_HOST_STAGING):
// ZeRO 1-3 on 1 and 2 ranks in fp32 and bf16 train byte for byte as without offload, with every
// step kept; with clipping every step is restored and redone, after an overflow the skipped step is
// restored, still byte for byte; and each deliberate fault (a chunk stepped before its last
// micro-step, the inputs not compared, a rollback without the restore) changes the result.
#include <catch2/catch.hpp>

#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>

#include <cmath>
#include <map>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/engine_worker_runs.h"
#include "tests/subprocess.h"
#include "zero/speculative_step.h"

using tessera::DeviceEvent;
using tessera::SpeculationFault;
using tessera::SpeculativeStep;
using tessera::StepInputs;
using tessera::testing::contains;
using tessera::testing::read_file;
using tessera::testing::TempDir;
using tessera::testing::engine_worker::case_outputs;
using tessera::testing::engine_worker::train;

namespace {

// Two groups: group 0 of two buckets, group 1 never speculated. Each chunk is one tensor; its step
// adds |lr|, and then throws when the lr is negative.
struct Chunks {
  std::vector<at::Tensor> chunk = {at::full({4}, 1.0f), at::full({4}, 2.0f)};
  SpeculativeStep speculation;
  explicit Chunks(SpeculationFault fault = SpeculationFault::None)
      : speculation({2, 0},
                    [this](int, int bucket, const StepInputs& in) {
                      chunk[bucket].add_(std::abs(in.lr));
                      if (in.lr < 0) throw std::runtime_error("a failing step");  // half done
                    },
                    [this](int, int bucket) { return std::vector<at::Tensor>{chunk[bucket]}; }, 1.0, fault) {}
  static std::vector<StepInputs> inputs(double lr) {
    StepInputs in;
    in.lr = lr;
    return {in, in};
  }
  bool at(float first, float second) const {
    return at::equal(chunk[0], at::full({4}, first)) && at::equal(chunk[1], at::full({4}, second));
  }
};

}  // namespace

TEST_CASE("speculative step: chunks kept when the inputs match, restored when they do not or on cancel") {
  Chunks c;
  c.speculation.begin(Chunks::inputs(0.5), /*boundary=*/true);
  c.speculation.submit(0, 0, DeviceEvent());
  c.speculation.submit(0, 1, DeviceEvent());
  c.speculation.submit(1, 0, DeviceEvent());  // a group never speculated: ignored
  auto kept = c.speculation.settle(Chunks::inputs(0.5));
  CHECK(kept == std::vector<std::vector<char>>{{1, 1}, {}});
  CHECK(c.at(1.5f, 2.5f));

  c.speculation.begin(Chunks::inputs(0.5), true);  // the step will have another lr (clipping, say)
  c.speculation.submit(0, 1, DeviceEvent());
  kept = c.speculation.settle(Chunks::inputs(0.25));
  CHECK(kept == std::vector<std::vector<char>>{{0, 0}, {}});
  CHECK(c.at(1.5f, 2.5f));  // restored

  c.speculation.begin(Chunks::inputs(0.5), true);  // a skipped step: cancelled
  c.speculation.submit(0, 0, DeviceEvent());
  c.speculation.cancel();
  CHECK(c.at(1.5f, 2.5f));
  CHECK(c.speculation.settle(Chunks::inputs(0.5)) == std::vector<std::vector<char>>{{0, 0}, {}});  // nothing open

  c.speculation.begin(Chunks::inputs(0.5), /*boundary=*/false);  // not the window's last micro-step
  CHECK_FALSE(c.speculation.open());
  c.speculation.submit(0, 0, DeviceEvent());
  CHECK(c.at(1.5f, 2.5f));

  const auto counts = c.speculation.counts();
  CHECK(counts.committed == 1);
  CHECK(counts.rolled_back == 2);
  CHECK(counts.chunks == 4);
  CHECK(c.speculation.copy_bytes() == 2 * 4 * 4);
}

TEST_CASE("speculative step: a chunk's failed step is rethrown at settle, what it wrote restored") {
  Chunks c;
  auto in = Chunks::inputs(0.5);
  in[0].lr = -1;  // chunk 0's step writes, then fails: chunk 1 is not stepped after it
  c.speculation.begin(in, true);
  c.speculation.submit(0, 0, DeviceEvent());
  c.speculation.submit(0, 1, DeviceEvent());
  CHECK_THROWS_WITH(c.speculation.settle(in), Catch::Contains("a failing step"));
  CHECK(c.at(1.0f, 2.0f));
}

TEST_CASE("speculative step: the deliberate faults change what is kept") {
  SECTION("unchecked: other inputs kept") {
    Chunks c(SpeculationFault::Unchecked);
    c.speculation.begin(Chunks::inputs(0.5), true);
    c.speculation.submit(0, 0, DeviceEvent());
    c.speculation.settle(Chunks::inputs(0.25));
    CHECK(c.at(1.5f, 2.0f));
  }
  SECTION("unrestored: a cancel leaves the step") {
    Chunks c(SpeculationFault::Unrestored);
    c.speculation.begin(Chunks::inputs(0.5), true);
    c.speculation.submit(0, 0, DeviceEvent());
    c.speculation.cancel();
    CHECK(c.at(1.5f, 2.0f));
  }
  SECTION("early: opened before the boundary, kept through it") {
    Chunks c(SpeculationFault::Early);
    c.speculation.begin(Chunks::inputs(0.5), /*boundary=*/false);
    c.speculation.submit(0, 0, DeviceEvent());
    c.speculation.begin(Chunks::inputs(0.5), true);
    c.speculation.submit(0, 0, DeviceEvent());  // stepped already: not again
    c.speculation.settle(Chunks::inputs(0.5));
    CHECK(c.at(1.5f, 2.0f));
  }
}

// Byte for byte against training without offload: the worker's dump of every step's loss and the
// final parameters. One launch per number of ranks runs the plain run and the speculated one of each
// setting (--then).
TEST_CASE("super_offload (TESSERA_HOST_STAGING): ZeRO 1-3 on 1 and 2 ranks in fp32 and bf16 train byte for byte as "
          "without offload - clipping and an overflow restore the speculated step") {
  const std::map<std::string, std::string> staging{{"TESSERA_HOST_STAGING", "1"}};
  const std::regex counts("speculated steps: kept (\\d+) restored (\\d+), chunks stepped during backward (\\d+)");
  struct Setting {
    std::vector<std::string> args;
    int kept, restored;  // of the 3 steps
  };
  for (int ranks : {1, 2}) {
    TempDir dir;
    std::vector<Setting> settings;
    for (const std::string stage : {"1", "2", "3"})
      for (const std::string dtype : {"fp32", "bf16"}) {
        Setting s{{"--stage", stage, "--dtype", dtype}, 3, 0};
        if (stage == "2") s.args.insert(s.args.end(), {"--gas", "2"});  // the host adds up the micro-steps
        if (dtype == "fp32" && ranks == 2) s.args.insert(s.args.end(), {"--optimizer", "sgd-plain"});  // a wrong scale shows
        if (stage == "1" && dtype == "bf16") {  // clipped every step: each speculation restored and redone
          s.args.insert(s.args.end(), {"--clip", "0.01"});
          s.kept = 0, s.restored = 3;
        }
        settings.push_back(s);
      }
    // fp16 with an overflow at step 1: that step skipped (restored), the others kept.
    settings.push_back({{"--stage", "2", "--dtype", "fp16", "--inject-inf-step", "1"}, 2, 1});
    std::vector<std::string> args;
    for (size_t i = 0; i < settings.size(); ++i) {
      std::vector<std::string> common = {"--steps", "3", "--bucket", "300", "--units"};
      common.insert(common.end(), settings[i].args.begin(), settings[i].args.end());
      for (const bool speculated : {false, true}) {
        if (!args.empty()) args.push_back("--then");
        args.insert(args.end(), common.begin(), common.end());
        const std::string dump = dir.file(std::to_string(i) + (speculated ? "-speculated.bin" : "-plain.bin"));
        args.insert(args.end(), {"--dump", dump});
        if (speculated) args.insert(args.end(), {"--offload", "cpu", "--super-offload"});
      }
    }
    auto run = train(ranks, args, staging);
    INFO(run.output);
    REQUIRE(run.status == 0);
    const std::vector<std::string> outputs = case_outputs(run.output);
    REQUIRE(outputs.size() == 2 * settings.size());
    for (size_t i = 0; i < settings.size(); ++i) {
      const std::string& out = outputs[2 * i + 1];
      INFO("ranks " << ranks << " case " << 2 * i + 1 << ":\n" << out);
      CHECK(contains(out, "engine ok"));
      CHECK(read_file(dir.file(std::to_string(i) + "-speculated.bin")) == read_file(dir.file(std::to_string(i) + "-plain.bin")));
      std::smatch m;
      REQUIRE(std::regex_search(out, m, counts));
      CHECK(std::stoi(m[1]) == settings[i].kept);
      CHECK(std::stoi(m[2]) == settings[i].restored);
      CHECK(std::stoi(m[3]) > 0);  // stepped during backward, not at the step
    }
  }
}

// Each fault (zero/speculative_step.h's SpeculationFault) must change what training produces:
// otherwise the byte-for-byte test above could not tell a correct speculation from a broken one.
TEST_CASE("super_offload: a chunk stepped early, inputs not compared, a rollback not restored - each changes the result") {
  const std::map<std::string, std::vector<std::string>> faults = {
      {"early", {"--stage", "2", "--gas", "2"}},
      {"unchecked", {"--stage", "1", "--clip", "0.01"}},
      {"unrestored", {"--stage", "2", "--dtype", "fp16", "--inject-inf-step", "1"}},
  };
  for (const auto& [fault, setting] : faults) {
    INFO(fault);
    TempDir dir;
    std::vector<std::string> common = {"--steps", "3", "--bucket", "300"};
    common.insert(common.end(), setting.begin(), setting.end());
    std::vector<std::string> args = common;
    args.insert(args.end(), {"--dump", dir.file("plain.bin"), "--then"});
    args.insert(args.end(), common.begin(), common.end());
    args.insert(args.end(), {"--dump", dir.file("faulty.bin"), "--offload", "cpu", "--super-offload"});
    auto run = train(1, args, {{"TESSERA_HOST_STAGING", "1"}, {"TESSERA_TEST_SPECULATION_FAULT", fault}});
    INFO(run.output);
    REQUIRE(case_outputs(run.output).size() == 2);
    CHECK(read_file(dir.file("plain.bin")).size() > 0);
    CHECK(read_file(dir.file("faulty.bin")) != read_file(dir.file("plain.bin")));
  }
}

TEST_CASE("super_offload refuses what it cannot run by name: CPU ranks - NVMe - ZeRO-3 shards on the host - LAMB - "
          "with the delayed update") {
  const std::map<std::string, std::string> staging{{"TESSERA_HOST_STAGING", "1"}};
  const std::string key = "zero_optimization.offload_optimizer.super_offload: true ";
  auto cpu = train(1, {"--stage", "2", "--offload", "cpu", "--super-offload"});
  CHECK(contains(cpu.output, key + "overlaps the host's optimizer step with the GPU's backward"));
  TempDir dir;
  auto nvme = train(1, {"--stage", "2", "--offload", "nvme", "--nvme-path", dir.path, "--super-offload"}, staging);
  CHECK(contains(nvme.output, key + "needs zero_optimization.offload_optimizer.device \"cpu\" (found \"nvme\")"));
  auto stage3 = train(1, {"--stage", "3", "--offload", "cpu", "--offload-param", "cpu", "--super-offload"}, staging);
  CHECK(contains(stage3.output, key + "with zero_optimization.offload_param.device \"cpu\""));
  auto lamb = train(1, {"--stage", "2", "--optimizer", "lamb", "--offload", "cpu", "--super-offload"}, staging);
  CHECK(contains(lamb.output, key + "needs optimizer.type Adam, AdamW or SGD (found Lamb)"));
  auto delayed = train(1, {"--stage", "2", "--offload", "cpu", "--delayed", "1", "--super-offload"}, staging);
  CHECK(contains(delayed.output, key + "with offload_optimizer.delayed_param_update"));
  for (const auto* r : {&cpu, &nvme, &stage3, &lamb, &delayed}) CHECK(r->status != 0);
}
