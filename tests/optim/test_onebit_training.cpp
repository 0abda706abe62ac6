// The 1-bit optimizers (optim/onebit.h) training the example GPT (842K parameters) on fortunes on
// 2 ranks against their full-precision twins: 1-bit Adam and 0/1 Adam against Adam (120 steps),
// 1-bit LAMB against LAMB (200 steps). The mean of the last 50 losses within 2%; the steps before the
// freeze bit-identical; after it, the bytes each rank sends per step at most 1/20 of Adam's.
#include <catch2/catch.hpp>

#include <regex>
#include <string>
#include <vector>

#include "tests/example_runs.h"
#include "tests/subprocess.h"

using tessera::testing::contains;
using namespace tessera::testing::examples;

namespace {

// The freeze at 40. Adam's family runs 120 steps: the last-50 means measured 2.735 / 2.745 / 2.762
// for Adam / 1-bit Adam / 0/1 Adam (at 200: 2.6455 / 2.6454 / 2.6492). LAMB's runs 200: at 120
// LAMB is still falling fast and 1-bit LAMB's mean was 3% off; at 200 2.7176 / 2.7033.
constexpr int kAdamSteps = 120;
constexpr int kLambSteps = 200;
constexpr int kFreeze = 40;
// The warm-up's bit-identity needs no convergence: a run of 10 steps frozen at step 10.
constexpr int kShortFreeze = 10;
constexpr int kWarmUpLine = kFreeze / 10 - 2;  // a progress line wholly before the freeze (steps 21-30)

std::string config(const std::string& type, const std::string& params) {
  return R"({"train_micro_batch_size_per_gpu": 4, "steps_per_print": 10, "gradient_clipping": 1.0,
             "optimizer": {"type": ")" + type + R"(", "params": {)" + params + R"(}}})";
}
std::string adam(const std::string& type, const std::string& extra = "") {
  return config(type, R"("lr": 1e-3, "weight_decay": 0.01)" + extra);
}
std::string lamb(const std::string& type, const std::string& extra = "") {
  return config(type, R"("lr": 4e-3, "weight_decay": 0.01)" + extra);
}
const std::string kFreezeStep = R"(, "freeze_step": )" + std::to_string(kFreeze);
const std::string kShortFreezeStep = R"(, "freeze_step": )" + std::to_string(kShortFreeze);

// One progress line's numbers (every 10 steps): the interval's mean loss, and for the 1-bit
// family its phase and the bytes each rank sent per step on the data group.
struct Line {
  int step = 0;
  double loss = 0;
  std::string phase;
  double sent_kb = -1;
};
std::vector<Line> progress(const std::string& output) {
  std::vector<Line> lines;
  static const std::regex line(R"(step (\d+) \| loss ([0-9.]+) \|[^\n]*?grad norm [0-9.]+(?: \| ([a-z-]+) \| sent ([0-9.]+) KB/step)?)");
  for (std::sregex_iterator it(output.begin(), output.end(), line), end; it != end; ++it) {
    Line l;
    l.step = std::stoi((*it)[1]);
    l.loss = std::stod((*it)[2]);
    if ((*it)[3].matched) l.phase = (*it)[3], l.sent_kb = std::stod((*it)[4]);
    lines.push_back(l);
  }
  return lines;
}

// The mean loss of the last 50 steps (the last 5 progress lines, 10 steps each).
double last_50(const std::vector<Line>& lines, int steps) {
  REQUIRE(lines.size() == size_t(steps / 10));
  double sum = 0;
  for (size_t i = lines.size() - 5; i < lines.size(); ++i) sum += lines[i].loss;
  return sum / 5;
}

struct Run {
  std::string output;
  std::vector<Line> lines;
};
Run train(const std::string& cfg, int steps, const std::vector<std::string>& extra = {}) {
  auto out = run_example(TESSERA_TRAIN_GPT_PATH, 2, cfg, steps, tessera::testing::free_port(), extra);
  INFO(out.output);
  REQUIRE(out.status == 0);
  return {out.output, progress(out.output)};
}

// The parameters after the freeze step's worth of steps (`onebit` frozen at kShortFreeze):
// bit-identical to the full-precision twin.
void same_warm_up(const std::string& onebit, const std::string& twin) {
  tessera::testing::TempDir dir;
  train(onebit, kShortFreeze, {"--save-parameters", dir.file("onebit.bin")});
  train(twin, kShortFreeze, {"--save-parameters", dir.file("twin.bin")});
  const std::vector<float> a = read_parameters(dir.file("onebit.bin")), b = read_parameters(dir.file("twin.bin"));
  REQUIRE(a.size() > 800000);
  CHECK(max_difference(a, b) == 0.0);
}

}  // namespace

TEST_CASE("1-bit Adam and 0/1 Adam train the GPT like Adam with 1/20 of the bytes", "[slow]") {
  const Run reference = train(adam("Adam"), kAdamSteps);
  const double adam_loss = last_50(reference.lines, kAdamSteps);
  // Adam's gradient allreduce: the bytes per step the 1-bit steps are held against.
  const Run onebit = train(adam("OneBitAdam", kFreezeStep), kAdamSteps);
  const Run zero_one = train(adam("ZeroOneAdam", R"(, "var_freeze_step": )" + std::to_string(kFreeze)), kAdamSteps);
  const double onebit_loss = last_50(onebit.lines, kAdamSteps), zero_one_loss = last_50(zero_one.lines, kAdamSteps);
  INFO("Adam " << adam_loss << ", 1-bit Adam " << onebit_loss << ", 0/1 Adam " << zero_one_loss);
  CHECK(std::abs(onebit_loss - adam_loss) <= 0.02 * adam_loss);
  CHECK(std::abs(zero_one_loss - adam_loss) <= 0.02 * adam_loss);
  CHECK(adam_loss < 0.75 * reference.lines.front().loss);  // it learned something

  // Phases and bytes. Adam's lines carry no phase; its bytes come from a 1-bit run's warm-up line
  // (the same gradient allreduce).
  CHECK(reference.lines.back().phase.empty());
  REQUIRE(onebit.lines[kWarmUpLine].phase == "warm-up");
  const double full = onebit.lines[kWarmUpLine].sent_kb;  // the fp32 gradient allreduce
  CHECK(full > 3000);                           // ~4 bytes a parameter at 2 ranks
  for (const Run* run : {&onebit, &zero_one}) {
    const Line& last = run->lines.back();
    INFO(last.phase << " " << last.sent_kb << " KB/step against " << full);
    CHECK(last.phase == "compressed");
    CHECK(last.sent_kb <= full / 20);
  }
  same_warm_up(adam("OneBitAdam", kShortFreezeStep), adam("Adam"));
}

TEST_CASE("1-bit LAMB trains the GPT like LAMB with 1/20 of the bytes", "[slow]") {
  const Run reference = train(lamb("Lamb"), kLambSteps);
  const Run onebit = train(lamb("OneBitLamb", kFreezeStep), kLambSteps);
  const double lamb_loss = last_50(reference.lines, kLambSteps), onebit_loss = last_50(onebit.lines, kLambSteps);
  INFO("LAMB " << lamb_loss << ", 1-bit LAMB " << onebit_loss);
  CHECK(std::abs(onebit_loss - lamb_loss) <= 0.02 * lamb_loss);
  CHECK(lamb_loss < 0.75 * reference.lines.front().loss);
  CHECK(onebit.lines.back().phase == "compressed");
  CHECK(onebit.lines.back().sent_kb <= onebit.lines[kWarmUpLine].sent_kb / 20);
  same_warm_up(lamb("OneBitLamb", kShortFreezeStep), lamb("Lamb"));
}

// 1-bit Adam with mixed precision, gradient accumulation, tensor and pipeline parallelism (the
// compression on the data axis only): a small GPT, 100 steps, freeze at 40, against Adam in the same
// setting. The loss of the last 10 steps within 5% of Adam's (a frozen variance needs its warm-up:
// frozen at step 20 of 60 the gap measured 8-14%), the last steps compressed, and the data group's
// bytes per step after the freeze at most 1/20 of the warm-up's.
TEST_CASE("1-bit Adam composes with fp16 - bf16 - accumulation - tensor and pipeline parallelism", "[slow]") {
  struct Variant {
    const char* name;
    int ranks;
    std::string sections;
  };
  const std::vector<Variant> variants = {
      {"fp16", 2, R"("fp16": {"enabled": true, "initial_scale_power": 8})"},
      {"bf16", 2, R"("bf16": {"enabled": true})"},
      {"gas 2", 2, R"("gradient_accumulation_steps": 2)"},
      {"tp 2 x dp 2", 4, R"("tensor_parallel": {"tp_size": 2})"},
      {"pp 2 x dp 2", 4, R"("gradient_accumulation_steps": 2, "pipeline": {"stages": 2})"},
  };
  const std::vector<std::string> small = {"--n-layer", "2", "--n-head", "4", "--n-embd", "64"};
  auto run = [&](const Variant& v, const std::string& type, const std::string& extra) {
    std::string cfg = config(type, R"("lr": 2e-3, "weight_decay": 0.01)" + extra);
    cfg = cfg.substr(0, cfg.size() - 1) + ", " + v.sections + "}";
    auto out = run_example(TESSERA_TRAIN_GPT_PATH, v.ranks, cfg, 100, tessera::testing::free_port(), small);
    INFO(v.name << " " << type << "\n" << out.output);
    REQUIRE(out.status == 0);
    std::vector<Line> lines = progress(out.output);
    REQUIRE(lines.size() == 10);
    return lines;
  };
  for (const Variant& v : variants) {
    const std::vector<Line> adam_lines = run(v, "Adam", "");
    const std::vector<Line> onebit = run(v, "OneBitAdam", R"(, "freeze_step": 40)");
    INFO(v.name << ": Adam " << adam_lines.back().loss << ", 1-bit Adam " << onebit.back().loss << "; sent "
                << onebit.back().sent_kb << " KB/step after the freeze, " << onebit[3].sent_kb << " before");
    CHECK(std::abs(onebit.back().loss - adam_lines.back().loss) <= 0.05 * adam_lines.back().loss);
    CHECK(onebit.back().loss < 0.8 * onebit.front().loss);
    CHECK(onebit[3].phase == "warm-up");
    CHECK(onebit.back().phase == "compressed");
    CHECK(onebit.back().sent_kb <= onebit[3].sent_kb / 20);
  }
}

TEST_CASE("the 1-bit optimizers refuse ZeRO stages above 0 and backends tessera lacks with the reason") {
  auto refused = [](const std::string& cfg) {
    auto out = run_example(TESSERA_TRAIN_GPT_PATH, 2, cfg, 2, tessera::testing::free_port());
    CHECK(out.status != 0);
    return out.output;
  };
  const std::string zero1 = refused(R"({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1},
      "optimizer": {"type": "OneBitAdam", "params": {"freeze_step": 5}}})");
  INFO(zero1);
  CHECK(contains(zero1, "optimizer.type OneBitAdam runs with zero_optimization.stage 0 only (found 1)"));
  // The numbers for this model: 842496 parameters; fp32 all-gather 1.68 MB against 0.21 MB.
  CHECK(contains(zero1, "842496 parameters on this rank, 2 data-parallel ranks"));
  CHECK(contains(zero1, "1.68 MB for the parameter all-gather"));

  const std::string mpi = refused(R"({"train_micro_batch_size_per_gpu": 2,
      "optimizer": {"type": "ZeroOneAdam", "params": {"comm_backend_name": "mpi"}}})");
  INFO(mpi);
  CHECK(contains(mpi, "optimizer.params.comm_backend_name: \"mpi\" is not available"));
  CHECK(contains(mpi, "expected \"gloo\""));

  const std::string zero_freeze = refused(R"({"train_micro_batch_size_per_gpu": 2,
      "optimizer": {"type": "OneBitLamb", "params": {"freeze_step": 0}}})");
  INFO(zero_freeze);
  CHECK(contains(zero_freeze, "optimizer.params.freeze_step"));
}
