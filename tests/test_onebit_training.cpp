// The 1-bit optimizers (optim/onebit.h) training the example GPT (842K parameters) on fortunes on
// 2 ranks for 400 steps against their full-precision twins: 1-bit Adam and 0/1 Adam against Adam,
// 1-bit LAMB against LAMB. The mean of the last 50 losses within 2%; the steps before the freeze
// bit-identical; after it, the bytes each rank sends per step at most 1/20 of Adam's.
#include <catch2/catch.hpp>

#include <regex>
#include <string>
#include <vector>

#include "example_runs.h"
#include "subprocess.h"

using tessera::testing::contains;
using namespace tessera::testing::examples;

namespace {

constexpr int kSteps = 400;
constexpr int kFreeze = 60;

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
double last_50(const std::vector<Line>& lines) {
  REQUIRE(lines.size() == kSteps / 10);
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

// The parameters after the freeze step's worth of steps: bit-identical to the full-precision twin.
void same_warm_up(const std::string& onebit, const std::string& twin) {
  tessera::testing::TempDir dir;
  train(onebit, kFreeze, {"--save-parameters", dir.file("onebit.bin")});
  train(twin, kFreeze, {"--save-parameters", dir.file("twin.bin")});
  const std::vector<float> a = read_parameters(dir.file("onebit.bin")), b = read_parameters(dir.file("twin.bin"));
  REQUIRE(a.size() > 800000);
  CHECK(max_difference(a, b) == 0.0);
}

}  // namespace

TEST_CASE("1-bit Adam and 0/1 Adam train the GPT like Adam with 1/20 of the bytes") {
  const Run reference = train(adam("Adam"), kSteps);
  const double adam_loss = last_50(reference.lines);
  // Adam's gradient allreduce: the bytes per step the 1-bit steps are held against.
  const Run onebit = train(adam("OneBitAdam", kFreezeStep), kSteps);
  const Run zero_one = train(adam("ZeroOneAdam", R"(, "var_freeze_step": )" + std::to_string(kFreeze)), kSteps);
  const double onebit_loss = last_50(onebit.lines), zero_one_loss = last_50(zero_one.lines);
  INFO("Adam " << adam_loss << ", 1-bit Adam " << onebit_loss << ", 0/1 Adam " << zero_one_loss);
  CHECK(std::abs(onebit_loss - adam_loss) <= 0.02 * adam_loss);
  CHECK(std::abs(zero_one_loss - adam_loss) <= 0.02 * adam_loss);
  CHECK(adam_loss < 0.75 * reference.lines.front().loss);  // it learned something

  // Phases and bytes. Adam's lines carry no phase; its bytes come from a 1-bit run's warm-up line
  // (the same gradient allreduce).
  CHECK(reference.lines.back().phase.empty());
  REQUIRE(onebit.lines[4].phase == "warm-up");
  const double full = onebit.lines[4].sent_kb;  // steps 41–50: the fp32 gradient allreduce
  CHECK(full > 3000);                           // ~4 bytes a parameter at 2 ranks
  for (const Run* run : {&onebit, &zero_one}) {
    const Line& last = run->lines.back();
    INFO(last.phase << " " << last.sent_kb << " KB/step against " << full);
    CHECK(last.phase == "compressed");
    CHECK(last.sent_kb <= full / 20);
  }
  same_warm_up(adam("OneBitAdam", kFreezeStep), adam("Adam"));
}

TEST_CASE("1-bit LAMB trains the GPT like LAMB with 1/20 of the bytes") {
  const Run reference = train(lamb("Lamb"), kSteps);
  const Run onebit = train(lamb("OneBitLamb", kFreezeStep), kSteps);
  const double lamb_loss = last_50(reference.lines), onebit_loss = last_50(onebit.lines);
  INFO("LAMB " << lamb_loss << ", 1-bit LAMB " << onebit_loss);
  CHECK(std::abs(onebit_loss - lamb_loss) <= 0.02 * lamb_loss);
  CHECK(lamb_loss < 0.75 * reference.lines.front().loss);
  CHECK(onebit.lines.back().phase == "compressed");
  CHECK(onebit.lines.back().sent_kb <= onebit.lines[4].sent_kb / 20);
  same_warm_up(lamb("OneBitLamb", kFreezeStep), lamb("Lamb"));
}
