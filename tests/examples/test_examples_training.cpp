// The example programs end to end through the launcher: the byte-level GPT on fortunes gives the
// same loss on 1 and 2 ranks for the same global batch, and the loss falls; the CNN trains too.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <algorithm>
#include <map>
#include <regex>

#include "parallel/pipeline/schedule.h"
#include "tests/example_runs.h"
#include "tests/examples/gpt_runs.h"
#include "tests/subprocess.h"

using tessera::testing::contains;
using namespace tessera::testing::examples;

namespace {

// The 1-rank run every multi-rank train_gpt run is compared with (10 steps, global batch 16), run
// once: its final loss and its final parameters.
struct Reference {
  double loss = -1;
  std::vector<double> grad_norms;
  std::vector<float> parameters;
};
// `n_layer`: the model's blocks when not the default 4 (--n-layer), one reference run for each.
const Reference& reference(const std::string& n_layer = "") {
  static std::map<std::string, Reference> refs;
  auto it = refs.find(n_layer);
  if (it != refs.end()) return it->second;
  tessera::testing::TempDir dir;
  std::vector<std::string> flags{"--save-parameters", dir.file("one.bin")};
  if (!n_layer.empty()) flags.insert(flags.end(), {"--n-layer", n_layer});
  auto one = run_gpt(1, gpt_config(16, 1), 10, tessera::testing::free_port(), flags);
  INFO(one.output);
  REQUIRE(one.status == 0);
  CHECK(contains(one.output, "step 10 | loss "));
  return refs[n_layer] = Reference{final_loss(one.output), grad_norms(one.output), read_parameters(dir.file("one.bin"))};
}
double reference_loss() { return reference().loss; }

}  // namespace

// Runs train_gpt on `ranks` ranks for 10 steps and checks it against the 1-rank run: final loss,
// every printed gradient norm, and every parameter (gathered from slices, partitions and stages).
// Returns the output for further checks; `what` names the layout in a failure.
std::string check_against_reference(int ranks, const std::string& config, const std::string& what,
                                    std::vector<std::string> flags = {}) {
  const auto n_layer = std::find(flags.begin(), flags.end(), "--n-layer");
  const Reference& ref = reference(n_layer != flags.end() && n_layer + 1 != flags.end() ? *(n_layer + 1) : "");
  REQUIRE(!ref.parameters.empty());
  tessera::testing::TempDir dir;
  flags.insert(flags.end(), {"--save-parameters", dir.file("parameters.bin")});
  auto run = run_gpt(ranks, config, 10, tessera::testing::free_port(), flags);
  INFO(what << "\n" << run.output);
  REQUIRE(run.status == 0);
  CHECK(std::abs(final_loss(run.output) - ref.loss) < 1e-4);
  CHECK(same_norms(grad_norms(run.output), ref.grad_norms));
  CHECK(max_difference(read_parameters(dir.file("parameters.bin")), ref.parameters) < kParameterTolerance);
  return run.output;
}

TEST_CASE("train_gpt: 1 rank and 2 ranks (ZeRO 1 - 2 and 3) reach the same loss and parameters on the same global batch") {
  const Reference& ref = reference();
  CHECK(ref.loss > 0);
  CHECK(ref.loss < 5.4);  // from ln(256) = 5.55 at the start
  for (int stage : {1, 2, 3}) check_against_reference(2, gpt_config(8, stage), "2 ranks, ZeRO " + std::to_string(stage));
}

// DeepSpeed's averaging orders (zero/zero_stage.h): divide by the data-parallel size (or by a
// factor) before the reduction and sum, the rest after; the same average as the default's.
TEST_CASE("train_gpt: prescale_gradients and gradient_predivide_factor reach the 1-rank loss and parameters") {
  check_against_reference(2, with_sections(gpt_config(8, 0), R"("prescale_gradients": true)"), "ZeRO 0, prescale");
  check_against_reference(2, with_sections(gpt_config(8, 2), R"("prescale_gradients": true)"), "ZeRO 2, prescale");
  check_against_reference(2, with_sections(gpt_config(8, 1), R"("gradient_predivide_factor": 4.0)"),
                          "ZeRO 1, predivide 4");
}

TEST_CASE("train_gpt: tensor parallelism (tp 2 and 4 with and without sequence parallelism - tp 2 x dp 2 with "
          "ZeRO 1-3) reaches the 1-rank loss and parameters", "[slow]") {
  struct Run { int ranks, tp, micro, stage; bool sp; };
  for (Run r : {Run{2, 2, 16, 1, false}, Run{2, 2, 16, 2, true}, Run{4, 2, 8, 1, false}, Run{4, 2, 8, 2, true},
                Run{4, 2, 8, 3, true}, Run{4, 4, 16, 1, false}, Run{4, 4, 16, 2, true}}) {
    const std::string config =
        with_sections(gpt_config(r.micro, r.stage), "\"tensor_parallel\": {\"tp_size\": " + std::to_string(r.tp) +
                                                        ", \"sequence_parallel\": " + (r.sp ? "true" : "false") + "}");
    const std::string output = check_against_reference(
        r.ranks, config, "ranks " + std::to_string(r.ranks) + " tp " + std::to_string(r.tp) + " ZeRO " +
                             std::to_string(r.stage) + (r.sp ? " sp" : ""));  // parameters gathered from their slices
    CHECK(contains(output, "tensor " + std::to_string(r.tp)));
  }
}

TEST_CASE("train_gpt: pipeline stages (pp 2 and 4 by 1F1B and GPipe - pp 2 x dp 2 with ZeRO 0-2 - pp 2 x tp 2 - "
          "pp 2 x dp 2 x tp 2 - checkpointed blocks) reach the 1-rank loss and parameters", "[slow]") {
  // 4 micro-batches a step through the pipeline; micro x dp x 4 = the reference's 16 sequences.
  struct Run { int ranks, pp, tp, micro, stage; const char* schedule; bool sp; };
  for (Run r : {Run{2, 2, 1, 4, 1, "1f1b", false}, Run{2, 2, 1, 4, 0, "gpipe", false}, Run{4, 4, 1, 4, 2, "1f1b", false},
                Run{4, 2, 1, 2, 0, "1f1b", false}, Run{4, 2, 1, 2, 1, "gpipe", false}, Run{4, 2, 1, 2, 2, "1f1b", false},
                Run{4, 2, 2, 4, 1, "1f1b", true}, Run{8, 2, 2, 2, 2, "1f1b", true}}) {
    const std::string config = with_sections(
        gpt_config(r.micro, r.stage, 4),
        "\"pipeline\": {\"stages\": " + std::to_string(r.pp) + ", \"schedule\": \"" + r.schedule +
            "\"}, \"tensor_parallel\": {\"tp_size\": " + std::to_string(r.tp) +
            ", \"sequence_parallel\": " + (r.sp ? "true" : "false") + "}");
    // The gradient norms count the tied wte once; the parameters come from every stage (the tied
    // wte from the first; the last stage's copy is the same).
    const std::string output = check_against_reference(
        r.ranks, config, "ranks " + std::to_string(r.ranks) + " pp " + std::to_string(r.pp) + " tp " +
                             std::to_string(r.tp) + " ZeRO " + std::to_string(r.stage) + " " + r.schedule);
    CHECK(contains(output, std::to_string(r.pp) + " pipeline stages"));
  }
  // Each stage's blocks recomputed in backward (the GPT's own checkpointing, inside its stage).
  check_against_reference(2, with_sections(gpt_config(4, 1, 4), R"("pipeline": {"stages": 2})"),
                          "pp 2 with --checkpoint-activations", {"--checkpoint-activations"});
}

// The schedules with less idle time (parallel/pipeline/schedule.h): interleaved 1F1B, each rank
// holding v = 2 model chunks (the GPT cut into p·v chunks; 6 blocks at p 4), and ZB-H1, each
// backward split into the input's gradient and the weights' (parallel/pipeline/split_backward.h),
// composed with data parallelism at ZeRO 0-2 and tensor parallelism; the tied wte sits on stage 0's
// first chunk and the last stage's last.
TEST_CASE("train_gpt: interleaved 1F1B and ZB-H1 (pp 2 and 4 - pp 2 x dp 2 at ZeRO 0-2 - pp 2 x tp 2) reach the "
          "1-rank loss and parameters", "[slow]") {
  struct Run { int ranks, pp, v, tp, micro, accumulation, stage; const char* schedule; const char* n_layer; };
  for (Run r : {Run{2, 2, 2, 1, 4, 4, 1, "interleaved_1f1b", ""}, Run{4, 4, 2, 1, 4, 4, 0, "interleaved_1f1b", "6"},
                Run{4, 2, 2, 1, 2, 4, 2, "interleaved_1f1b", ""}, Run{4, 2, 2, 2, 4, 4, 1, "interleaved_1f1b", ""},
                Run{2, 2, 1, 1, 4, 4, 1, "zb_h1", ""}, Run{4, 4, 1, 1, 4, 4, 2, "zb_h1", ""},
                Run{4, 2, 1, 1, 2, 4, 0, "zb_h1", ""}, Run{4, 2, 1, 2, 4, 4, 1, "zb_h1", ""}}) {
    const std::string config = with_sections(
        gpt_config(r.micro, r.stage, r.accumulation),
        "\"pipeline\": {\"stages\": " + std::to_string(r.pp) + ", \"schedule\": \"" + r.schedule +
            "\", \"virtual_stages\": " + std::to_string(r.v) + "}, \"tensor_parallel\": {\"tp_size\": " +
            std::to_string(r.tp) + ", \"sequence_parallel\": " + (r.tp > 1 ? "true" : "false") + "}");
    std::vector<std::string> flags;
    if (*r.n_layer) flags = {"--n-layer", r.n_layer};
    const std::string output = check_against_reference(
        r.ranks, config,
        "ranks " + std::to_string(r.ranks) + " pp " + std::to_string(r.pp) + " v " + std::to_string(r.v) + " tp " +
            std::to_string(r.tp) + " ZeRO " + std::to_string(r.stage) + " " + r.schedule,
        flags);
    CHECK(contains(output, std::string(r.schedule) + " schedule"));
    if (r.v > 1) CHECK(contains(output, "chunk 1 (stage 1)"));
    // Each stage held what the simulator says it holds.
    const std::regex held("held (\\d+) micro-batches \\(simulated (\\d+)\\)");
    for (auto it = std::sregex_iterator(output.begin(), output.end(), held);
         it != std::sregex_iterator(); ++it)
      CHECK((*it)[1] == (*it)[2]);
  }
}

// ZB-V (parallel/pipeline/schedule.h): two chunks a stage in a V, stage s holding chunks s and
// 2p − 1 − s, so stage 0 holds both the embedding and the head (the tied wte used by both of its
// chunks, no copy to sum) and computes the loss; each backward split as ZB-H1's. Against the same
// 1-rank run, with data parallelism at ZeRO 0-3 and tensor parallelism.
TEST_CASE("train_gpt: ZB-V (pp 2 and 4 - pp 2 x dp 2 at ZeRO 0-3 - pp 2 x tp 2) reaches the 1-rank loss and parameters",
          "[slow]") {
  struct Run { int ranks, pp, tp, micro, accumulation, stage; const char* n_layer; const char* extra; };
  for (Run r : {Run{2, 2, 1, 4, 4, 1, "", ""}, Run{4, 4, 1, 4, 4, 2, "6", ""}, Run{4, 2, 1, 2, 4, 0, "", ""},
                Run{4, 2, 1, 2, 4, 3, "", R"(, "zero3_gather": "micro_batch")"}, Run{4, 2, 2, 4, 4, 1, "", ""}}) {
    const std::string config = with_sections(
        gpt_config(r.micro, r.stage, r.accumulation),
        "\"pipeline\": {\"stages\": " + std::to_string(r.pp) + ", \"schedule\": \"zb_v\"" + r.extra +
            "}, \"tensor_parallel\": {\"tp_size\": " + std::to_string(r.tp) +
            ", \"sequence_parallel\": " + (r.tp > 1 ? "true" : "false") + "}");
    std::vector<std::string> flags;
    if (*r.n_layer) flags = {"--n-layer", r.n_layer};
    tessera::testing::TempDir dir;
    const bool timeline = r.ranks == 2;
    if (timeline) flags.insert(flags.end(), {"--timeline", dir.file("timeline.jsonl")});
    const std::string output = check_against_reference(
        r.ranks, config,
        "ranks " + std::to_string(r.ranks) + " pp " + std::to_string(r.pp) + " tp " + std::to_string(r.tp) + " ZeRO " +
            std::to_string(r.stage) + " zb_v",
        flags);
    CHECK(contains(output, "zb_v schedule"));
    CHECK(contains(output, "pipeline costs read off the last batch"));
    // Each stage's idle beside the simulation's and the idle its costs' spread leads to expect (a
    // range around its mean).
    const std::regex expected(R"re(simulated with the batch's measured costs: ([0-9.]+); expected with their spread: ([0-9.]+), ([0-9.]+)-([0-9.]+)\))re");
    int stages_expected = 0;
    for (auto it = std::sregex_iterator(output.begin(), output.end(), expected); it != std::sregex_iterator(); ++it) {
      ++stages_expected;
      CHECK(std::stod((*it)[3]) <= std::stod((*it)[2]));
      CHECK(std::stod((*it)[2]) <= std::stod((*it)[4]));
    }
    CHECK(stages_expected == r.pp);
    if (timeline) {
      // Every stage's list on one clock (each stage's times plus its batch's start on the host's
      // clock): no activation is received before the other stage began to send it.
      std::ifstream in(dir.file("timeline.jsonl"));
      const std::regex line(R"re(\{"stage": (\d+), "op": "(\w+)", "micro_batch": (-?\d+), "chunk": (\d+), "start": ([0-9.]+), "end": ([0-9.]+)\})re");
      std::map<std::pair<int, int>, double> sent, received;  // (micro-batch, chunk 0 → 1 across stages) -> time
      int lines[2] = {0, 0};
      for (std::string text; std::getline(in, text);) {
        std::smatch f;
        REQUIRE(std::regex_match(text, f, line));
        const int stage = std::stoi(f[1]), mb = std::stoi(f[3]), chunk = std::stoi(f[4]);
        ++lines[stage];
        CHECK(std::stod(f[6]) >= std::stod(f[5]));
        // Stage 0's chunk 0 sends to stage 1's chunk 0 (model chunk 1).
        if (stage == 0 && f[2] == "SendActivation" && chunk == 0) sent[{mb, 0}] = std::stod(f[5]);
        if (stage == 1 && f[2] == "RecvActivation" && chunk == 0) received[{mb, 0}] = std::stod(f[6]);
      }
      CHECK(lines[0] == int(tessera::pipeline::zb_v(2, 4).stage[0].size()));
      CHECK(lines[1] == int(tessera::pipeline::zb_v(2, 4).stage[1].size()));
      REQUIRE(sent.size() == 4);
      REQUIRE(received.size() == 4);
      for (const auto& [key, at] : received) CHECK(at >= sent[key]);
    }
    CHECK(contains(output, "chunk " + std::to_string(2 * r.pp - 1) + " (stage 0)"));  // the V's last chunk
    const std::regex held("held (\\d+) micro-batches \\(simulated (\\d+)\\)");
    for (auto it = std::sregex_iterator(output.begin(), output.end(), held); it != std::sregex_iterator(); ++it)
      CHECK((*it)[1] == (*it)[2]);
  }
}

// ZeRO-3 under the pipeline (DeepSpeed refuses it): each stage's parameters partitioned over its
// data group, gathered once per batch (pipeline.zero3_gather "step") or around each forward and
// backward ("micro_batch"), by every schedule; the tied wte partitioned on both stages that hold it.
TEST_CASE("train_gpt: ZeRO-3 under the pipeline (gathered per step and per micro-batch, by 1F1B, ZB-H1 and "
          "interleaved 1F1B, with tp 2) reaches the 1-rank loss and parameters, holding half the parameters", "[slow]") {
  struct Run { int ranks, tp; const char* pipeline; };
  for (Run r : {Run{4, 1, R"({"stages": 2})"}, Run{4, 1, R"({"stages": 2, "schedule": "zb_h1", "zero3_gather": "micro_batch"})"},
                Run{4, 1, R"({"stages": 2, "schedule": "interleaved_1f1b", "virtual_stages": 2, "zero3_gather": "micro_batch"})"},
                Run{4, 1, R"({"stages": 2, "schedule": "zb_h1"})"}, Run{8, 2, R"({"stages": 2, "schedule": "gpipe"})"}}) {
    // 2 sequences x dp 2 x 4 micro-batches = the reference's 16 sequences
    const std::string config = with_sections(gpt_config(2, 3, 4),
                                             std::string("\"pipeline\": ") + r.pipeline +
                                                 ", \"tensor_parallel\": {\"tp_size\": " + std::to_string(r.tp) + "}");
    const std::string output = check_against_reference(r.ranks, config, std::string("ZeRO-3 ") + r.pipeline);
    // Between steps each stage holds its shard only: nothing gathered, half of its parameters' bytes.
    const std::regex stage_line("pipeline stage (\\d): .*parameters (\\d+) bytes held, gathered now (\\d+), at most (\\d+)");
    int stages = 0;
    for (auto it = std::sregex_iterator(output.begin(), output.end(), stage_line); it != std::sregex_iterator(); ++it) {
      ++stages;
      const double held = std::stod((*it)[2]), now = std::stod((*it)[3]), most = std::stod((*it)[4]);
      CHECK(now == 0);
      CHECK(held > 0);
      CHECK(std::abs(most / held - 2.0) < 0.01);  // gathered: the whole stage, twice the shard
    }
    CHECK(stages == 2);
  }
}

// bf16: each schedule runs the same micro-batches through the same stages, so every one ends where
// 1F1B does (the sums of a micro-batch's gradients in bf16 go in the same order), and within bf16's
// reach of the 1-rank bf16 run.
TEST_CASE("train_gpt: bf16 through the pipeline by every schedule ends where 1F1B and the 1-rank run do", "[slow]") {
  auto bf16 = [](int micro, int accumulation, const std::string& pipeline) {
    std::string config = with_sections(gpt_config(micro, 1, accumulation), R"("bf16": {"enabled": true})");
    return pipeline.empty() ? config : with_sections(config, "\"pipeline\": " + pipeline);
  };
  auto one = run_gpt(1, bf16(16, 1, ""), 10, tessera::testing::free_port());
  REQUIRE(one.status == 0);
  double one_f_one_b = 0;
  for (const char* pipeline : {R"({"stages": 2})", R"({"stages": 2, "schedule": "gpipe"})", R"({"stages": 2, "schedule": "zb_h1"})",
                               R"({"stages": 2, "schedule": "interleaved_1f1b", "virtual_stages": 2})",
                               R"({"stages": 2, "schedule": "zb_v"})"}) {
    auto run = run_gpt(2, bf16(4, 4, pipeline), 10, tessera::testing::free_port());
    INFO(pipeline << "\n" << run.output);
    REQUIRE(run.status == 0);
    if (one_f_one_b == 0) one_f_one_b = final_loss(run.output);
    CHECK(std::abs(final_loss(run.output) - one_f_one_b) < 1e-5);
    CHECK(std::abs(final_loss(run.output) - final_loss(one.output)) < 2e-3);
  }
}

TEST_CASE("train_gpt: the pipeline's schedule errors - virtual stages without interleaving, micro-batches not a "
          "multiple of the stages, chunks that do not divide the layers, a V of 3 chunks - name the keys and the values") {
  auto run = [](int ranks, const std::string& pipeline, int accumulation) {
    return run_example(TESSERA_TRAIN_GPT_PATH, ranks,
                       with_sections(gpt_config(4, 1, accumulation), "\"pipeline\": " + pipeline), 1,
                       tessera::testing::free_port(), {"--n-layer", "4"});
  };
  auto not_interleaved = run(2, R"({"stages": 2, "schedule": "1f1b", "virtual_stages": 2})", 4);
  CHECK(not_interleaved.status != 0);
  CHECK(contains(not_interleaved.output, "pipeline.virtual_stages 2 needs pipeline.schedule \"interleaved_1f1b\""));
  auto groups = run(2, R"({"stages": 2, "schedule": "interleaved_1f1b", "virtual_stages": 2})", 3);
  CHECK(groups.status != 0);
  CHECK(contains(groups.output, "gradient_accumulation_steps (pipeline.micro_batches) 3 must be a multiple of pipeline.stages 2"));
  auto uneven = run(2, R"({"stages": 2, "schedule": "interleaved_1f1b", "virtual_stages": 2, "partition_method": "type:block"})", 4);
  CHECK(uneven.status == 0);  // 4 blocks into 4 chunks
  auto three = run(2, R"({"stages": 2, "schedule": "interleaved_1f1b", "virtual_stages": 3, "partition_method": "type:block"})", 4);
  CHECK(three.status != 0);
  CHECK(contains(three.output, "pipeline.virtual_stages 3 x pipeline.stages 2 = 6 model chunks do not divide the 4 "
                               "layers matching \"type:block\" evenly"));
  auto recomputed = run_example(TESSERA_TRAIN_GPT_PATH, 2,
                                with_sections(gpt_config(4, 1, 4), R"("pipeline": {"stages": 2, "schedule": "zb_h1"})"), 1,
                                tessera::testing::free_port(), {"--checkpoint-activations"});
  CHECK(recomputed.status != 0);
  CHECK(contains(recomputed.output, "--checkpoint-activations with pipeline.schedule \"zb_h1\""));
  auto v_of_three = run(2, R"({"stages": 2, "schedule": "zb_v", "virtual_stages": 3})", 4);
  CHECK(v_of_three.status != 0);
  CHECK(contains(v_of_three.output, "pipeline.schedule \"zb_v\" places 2 model chunks on each stage (a V): "
                                    "pipeline.virtual_stages must be 2 (or left out), got 3"));
  auto unknown = run(2, R"({"stages": 2, "schedule": "dualpipe"})", 4);
  CHECK(unknown.status != 0);
  CHECK(contains(unknown.output, "pipeline.schedule"));
  CHECK(contains(unknown.output, "zb_h1"));
}

// Context parallelism (the config's context_parallel section; parallel/context_parallel/): each
// sequence of 64 tokens split over the context group, attention across it by Ulysses's
// all-to-alls or ring attention, the loss the whole sequences' mean; gradients averaged and ZeRO
// partitioning over data x context. Against the same 1-rank run: cp 2 and 4 by each method, cp 2 x
// dp 2 at ZeRO 2 and 3, cp 2 x tp 2 with sequence parallelism (heads split by tp, then by cp), cp 2
// x pp 2, and DeepSpeed's sequence_parallel_size.
TEST_CASE("train_gpt: context parallelism (Ulysses and ring at cp 2 and 4 - cp 2 x dp 2 at ZeRO 2 and 3 - cp 2 x tp 2 "
          "- cp 2 x pp 2) reaches the 1-rank loss and parameters", "[slow]") {
  auto cp = [](const std::string& method, int size) {
    return "\"context_parallel\": {\"size\": " + std::to_string(size) + ", \"method\": \"" + method + "\"}";
  };
  for (const char* method : {"ulysses", "ring"}) {
    for (int size : {2, 4}) {
      const std::string output = check_against_reference(size, with_sections(gpt_config(16, 1), cp(method, size)),
                                                         std::string(method) + " cp " + std::to_string(size));
      CHECK(contains(output, "context " + std::to_string(size) + " x tensor 1"));
    }
  }
  check_against_reference(4, with_sections(gpt_config(8, 2), cp("ring", 2)), "ring cp 2 x dp 2 ZeRO 2");
  check_against_reference(4, with_sections(gpt_config(8, 3), cp("ulysses", 2)), "ulysses cp 2 x dp 2 ZeRO 3");
  check_against_reference(
      4, with_sections(gpt_config(16, 1), cp("ulysses", 2) + R"(, "tensor_parallel": {"tp_size": 2, "sequence_parallel": true})"),
      "ulysses cp 2 x tp 2 with sequence parallelism");
  check_against_reference(4, with_sections(gpt_config(4, 1, 4), cp("ring", 2) + R"(, "pipeline": {"stages": 2})"),
                          "ring cp 2 x pp 2");
  check_against_reference(2, with_sections(gpt_config(16, 2), R"("sequence_parallel_size": 2)"),
                          "DeepSpeed's sequence_parallel_size 2 (Ulysses)");
}

TEST_CASE("train_gpt: context parallelism's bad input - heads Ulysses cannot split, a size that does not divide the "
          "world - is refused naming the fix") {
  auto run = run_example(TESSERA_TRAIN_GPT_PATH, 4,
                         with_sections(gpt_config(16, 1), R"("context_parallel": {"size": 4, "method": "ulysses"})"), 1,
                         tessera::testing::free_port(), {"--n-head", "2", "--n-embd", "64"});
  INFO(run.output);
  CHECK(run.status != 0);
  CHECK(contains(run.output, "2 heads (per tensor-parallel rank) are not divisible by context_parallel.size 4"));
  CHECK(contains(run.output, "use context_parallel.method \"ring\""));
  auto world = run_example(TESSERA_TRAIN_GPT_PATH, 2, with_sections(gpt_config(16, 1), R"("context_parallel": {"size": 4})"),
                           1, tessera::testing::free_port());
  INFO(world.output);
  CHECK(world.status != 0);
  CHECK(contains(world.output, "context_parallel.size"));
  CHECK(contains(world.output, "world size 2 is not divisible"));
}

// The C++ checkpoint API (Engine::save_checkpoint / load_checkpoint) through train_gpt's --save and
// --load: 5 steps, a checkpoint, 5 more from it equal the 1-rank 10-step run: exactly at the same
// layout, and within the parity tolerance after resharding (2 ranks at ZeRO 2 to 1 rank at ZeRO
// 0) or through 2 pipeline stages.
TEST_CASE("train_gpt --save and --load: resumed runs reach the 1-rank loss and parameters") {
  const Reference& ref = reference();
  REQUIRE(!ref.parameters.empty());
  struct Hop { int ranks; std::string config; };
  const std::string pipe = R"("pipeline": {"stages": 2})";
  const std::vector<std::pair<Hop, Hop>> cases = {
      {{1, gpt_config(16, 1)}, {1, gpt_config(16, 1)}},                                // the same layout: exact
      {{2, gpt_config(8, 2)}, {1, gpt_config(16, 0)}},                                 // dp 2 ZeRO 2 -> dp 1 ZeRO 0
      {{2, with_sections(gpt_config(4, 1, 4), pipe)}, {2, with_sections(gpt_config(4, 1, 4), pipe)}}};
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& [first, second] = cases[i];
    tessera::testing::TempDir dir;
    auto a = run_gpt(first.ranks, first.config, 5, tessera::testing::free_port(),
                         {"--save", dir.file("ckpt")});
    INFO("case " << i << "\n" << a.output);
    REQUIRE(a.status == 0);
    CHECK(contains(a.output, "train_gpt: saved " + dir.file("ckpt") + "/global_step5"));
    auto b = run_gpt(second.ranks, second.config, 10, tessera::testing::free_port(),
                         {"--load", dir.file("ckpt"), "--save-parameters", dir.file("parameters.bin")});
    INFO(b.output);
    REQUIRE(b.status == 0);
    CHECK(contains(b.output, "resumed from " + dir.file("ckpt") + "/global_step5 at step 5"));
    const double difference = max_difference(read_parameters(dir.file("parameters.bin")), ref.parameters);
    if (i == 0) {
      CHECK(final_loss(b.output) == ref.loss);
      CHECK(difference == 0);
    } else {
      CHECK(std::abs(final_loss(b.output) - ref.loss) < 1e-4);
      CHECK(difference < kParameterTolerance);
    }
  }
}

// Any layout at load: saved at tp 2 x pp 2 x dp 2 (ZeRO 1, 8 ranks) after 5 steps, loaded at 1 rank,
// tp 4, pp 4 and tp 2 x dp 2 at ZeRO 3: the loaded parameters are the saved ones bit for bit (read
// back before any step), and 5 more steps reach the 1-rank 10-step run within the parity tolerance.
// Then back: tp 4's checkpoint at step 10 loads at tp 2 x pp 2 x dp 2 bit for bit. The GPT's fused
// q|k|v projection (fused 3), its row- and column-parallel weights, the vocabulary-parallel embedding
// tied to the head across stages, and the moments of AdamW all cross the change.
TEST_CASE("train_gpt --load at another tensor, pipeline and data degree and ZeRO stage keeps every value") {
  const Reference& ref = reference();
  REQUIRE(!ref.parameters.empty());
  tessera::testing::TempDir dir;
  const std::string tp2_pp2_dp2 =
      with_sections(gpt_config(4, 1, 2), R"("tensor_parallel": {"tp_size": 2}, "pipeline": {"stages": 2})");
  auto saved = run_gpt(8, tp2_pp2_dp2, 5, tessera::testing::free_port(),
                           {"--save", dir.file("ckpt"), "--save-parameters", dir.file("saved.bin")});
  INFO(saved.output);
  REQUIRE(saved.status == 0);
  const std::vector<float> at_save = read_parameters(dir.file("saved.bin"));
  struct Layout { std::string what; int ranks; std::string config; bool read_back; };
  const std::vector<Layout> layouts = {
      {"1 rank", 1, gpt_config(16, 0), true},
      {"tp 4", 4, with_sections(gpt_config(4, 1, 4), R"("tensor_parallel": {"tp_size": 4})"), false},
      {"pp 4", 4, with_sections(gpt_config(4, 1, 4), R"("pipeline": {"stages": 4})"), false},
      {"tp 2 x dp 2 ZeRO 3", 4, with_sections(gpt_config(4, 3, 2), R"("tensor_parallel": {"tp_size": 2})"), true}};
  for (const Layout& l : layouts) {
    INFO(l.what);
    if (l.read_back) {  // no step after the load: what it holds is what was saved
      auto loaded = run_gpt(l.ranks, l.config, 5, tessera::testing::free_port(),
                                {"--load", dir.file("ckpt"), "--save-parameters", dir.file("loaded.bin")});
      INFO(loaded.output);
      REQUIRE(loaded.status == 0);
      CHECK(read_parameters(dir.file("loaded.bin")) == at_save);
    }
    std::vector<std::string> flags{"--load", dir.file("ckpt"), "--save-parameters", dir.file("resumed.bin")};
    if (l.what == "tp 4") flags.insert(flags.end(), {"--save", dir.file("tp4")});
    auto resumed = run_gpt(l.ranks, l.config, 10, tessera::testing::free_port(), flags);
    INFO(resumed.output);
    REQUIRE(resumed.status == 0);
    CHECK(contains(resumed.output, "resumed from " + dir.file("ckpt") + "/global_step5 at step 5"));
    CHECK(std::abs(final_loss(resumed.output) - ref.loss) < 1e-4);
    CHECK(max_difference(read_parameters(dir.file("resumed.bin")), ref.parameters) < kParameterTolerance);
    if (l.what == "tp 4") std::rename(dir.file("resumed.bin").c_str(), dir.file("tp4.bin").c_str());
  }
  auto back = run_gpt(8, tp2_pp2_dp2, 10, tessera::testing::free_port(),
                          {"--load", dir.file("tp4"), "--save-parameters", dir.file("back.bin")});
  INFO(back.output);
  REQUIRE(back.status == 0);
  CHECK(read_parameters(dir.file("back.bin")) == read_parameters(dir.file("tp4.bin")));
}

// checkpoint.async_save through the engine's periodic saves (save_interval 2, 2 ranks at ZeRO 2):
// each save returns once the state is copied to host memory and a thread writes and commits it
// while the next steps run (its writes held back 1.5 s by the tests' hook, so that they do). The
// last one (step 6) is waited for at the engine's end and loads bit for bit; step 4's, written
// while steps 5 and 6 changed the engine's buffers, holds step 4's state: resumed from it, the run
// reaches the 1-rank 10-step run (a save that wrote the live buffers instead fails this).
TEST_CASE("train_gpt with checkpoint.async_save: saves written while training goes on hold the state at the save") {
  const Reference& ref = reference();
  REQUIRE(!ref.parameters.empty());
  tessera::testing::TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  const std::string config = with_sections(
      gpt_config(8, 2), R"("checkpoint": {"save_interval": 2, "async_save": true, "save_dir": ")" + ckpt + R"("})");
  // Each write starts 1.5 s late (the test hook): steps run while a save's copy waits for it.
  ::setenv("TESSERA_CHECKPOINT_WRITE_DELAY_MS", "1500", 1);
  auto run = run_gpt(2, config, 6, tessera::testing::free_port(),
                         {"--save-parameters", dir.file("six.bin")});
  ::unsetenv("TESSERA_CHECKPOINT_WRITE_DELAY_MS");
  INFO(run.output);
  REQUIRE(run.status == 0);
  auto latest = [&] {
    std::ifstream in(ckpt + "/latest");
    std::string tag;
    std::getline(in, tag);
    return tag;
  };
  REQUIRE(latest() == "global_step6");
  auto loaded = run_gpt(1, gpt_config(16, 0), 6, tessera::testing::free_port(),
                            {"--load", ckpt, "--save-parameters", dir.file("loaded.bin")});
  INFO(loaded.output);
  REQUIRE(loaded.status == 0);
  CHECK(read_parameters(dir.file("loaded.bin")) == read_parameters(dir.file("six.bin")));
  std::ofstream(ckpt + "/latest", std::ios::trunc) << "global_step4";
  auto resumed = run_gpt(1, gpt_config(16, 0), 10, tessera::testing::free_port(),
                             {"--load", ckpt, "--save-parameters", dir.file("resumed.bin")});
  INFO(resumed.output);
  REQUIRE(resumed.status == 0);
  CHECK(contains(resumed.output, "resumed from " + ckpt + "/global_step4 at step 4"));
  CHECK(std::abs(final_loss(resumed.output) - ref.loss) < 1e-4);
  CHECK(max_difference(read_parameters(dir.file("resumed.bin")), ref.parameters) < kParameterTolerance);
}

TEST_CASE("train_gpt: eval_batch through 2 pipeline stages gives the 1-rank validation loss") {
  // The same micro-batches (4 sequences, 4 a step) on 1 rank and through the pipeline.
  const std::string one = gpt_config(4, 1, 4);
  const std::string pp2 = with_sections(one, R"("pipeline": {"stages": 2})");
  auto validation = [](const std::string& output) {
    std::smatch m;
    return std::regex_search(output, m, std::regex("validation loss ([0-9.]+)")) ? std::stod(m[1]) : -1.0;
  };
  auto a = run_gpt(1, one, 2, tessera::testing::free_port(), {"--eval-every", "2"});
  auto b = run_gpt(2, pp2, 2, tessera::testing::free_port(), {"--eval-every", "2"});
  INFO(a.output << "\n" << b.output);
  REQUIRE(a.status == 0);
  REQUIRE(b.status == 0);
  CHECK(validation(a.output) > 0);
  CHECK(std::abs(validation(b.output) - validation(a.output)) < 1e-4);
}

TEST_CASE("train_gpt: pipeline bad input - more stages than layers - is refused naming the key") {
  // The example GPT has 6 layers (embedding, 4 blocks, head).
  auto deep = run_example(TESSERA_TRAIN_GPT_PATH, 8, with_sections(gpt_config(4, 1, 4), R"("pipeline": {"stages": 8})"), 1,
                          tessera::testing::free_port());
  INFO(deep.output);
  CHECK(deep.status != 0);
  CHECK(contains(deep.output, "pipeline.stages: 8 stages for a model of 6 layers"));
}

TEST_CASE("train_gpt --checkpoint-activations: ZeRO 2 on 2 ranks and tp 2 with partitioned inputs reach the 1-rank loss") {
  const double reference = reference_loss();
  const std::string dp2 = gpt_config(8, 2);
  const std::string tp2 = with_sections(
      gpt_config(16, 1), R"("tensor_parallel": {"tp_size": 2}, "activation_checkpointing": {"partition_activations": true})");
  for (const std::string& config : {dp2, tp2}) {
    auto run = run_gpt(2, config, 10, tessera::testing::free_port(),
                           {"--checkpoint-activations"});
    INFO(run.output);
    REQUIRE(run.status == 0);
    CHECK(std::abs(final_loss(run.output) - reference) < 1e-4);
  }
}

// A value of the flops profiler's report ("fwd flops per GPU:   1.23 G" -> 1.23e9), -1 when missing.
double report_value(const std::string& report, const std::string& label) {
  std::smatch m;
  const std::regex line("\\n" + label + ":\\s+([0-9.]+) ?([KMGTB]?)");
  if (!std::regex_search(report, m, line)) return -1;
  const std::map<std::string, double> scale{{"", 1}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"B", 1e9}, {"T", 1e12}};
  return std::stod(m[1]) * scale.at(m[2]);
}

TEST_CASE("train_gpt with flops_profiler: rank 0 reports its units at profile_step - the forward and backward are 6N "
          "+ 12 L d T flops a token - recomputation is not counted - tensor parallel ranks hold their share") {
  const int64_t L = 2, d = 64, T = 32, V = 256, micro = 4;
  const std::vector<std::string> sizes{"--n-layer", "2", "--n-embd", "64", "--n-head", "4", "--seq-len", "32"};
  // N: the blocks' matmul weights (12 d^2 a block) and the tied head.
  const double n = double(L * 12 * d * d + V * d);
  const double expected = double(micro * T) * (6 * n + 12 * L * d * T);
  auto profile = [&](const std::string& sections, std::vector<std::string> flags) {
    tessera::testing::TempDir dir;
    const std::string config = with_sections(gpt_config(micro, 1), sections + R"("flops_profiler": {"enabled": true,
        "profile_step": 2, "peak_tflops": 1.0, "output_file": ")" + dir.file("flops.txt") + R"("})");
    flags.insert(flags.end(), sizes.begin(), sizes.end());
    auto run = run_example(TESSERA_TRAIN_GPT_PATH, 2, config, 3, tessera::testing::free_port(), flags);
    INFO(run.output);
    REQUIRE(run.status == 0);
    std::ifstream in(dir.file("flops.txt"));
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  const std::string plain = profile("", {});
  INFO(plain);
  CHECK(std::count(plain.begin(), plain.end(), '\n') > 20);
  CHECK(contains(plain, "Profile Summary at step 2:"));
  CHECK(plain.find("Profile Summary") == plain.rfind("Profile Summary"));  // rank 0 alone, once
  for (const char* row : {"(embedding): Unit(", "(h.0): Unit(", "(h.1): Unit(", "(head): Unit(", "bwd latency:",
                          "MFU = FLOPS per GPU / peak (1 TFLOPS):", "depth 1:", "'h': "})
    CHECK(contains(plain, row));
  const double flops = report_value(plain, "fwd flops per GPU");
  CHECK(std::abs(3 * flops - expected) < 0.05 * expected);
  CHECK(report_value(plain, "data parallel size") == 2);

  const std::string recomputed = profile("", {"--checkpoint-activations"});
  INFO(recomputed);
  CHECK(report_value(recomputed, "fwd flops per GPU") == flops);

  const std::string tp2 = profile(R"("tensor_parallel": {"tp_size": 2}, )", {});
  INFO(tp2);
  CHECK(report_value(tp2, "model parallel size") == 2);
  // Each tensor rank's matmuls are half the blocks' and the vocabulary-split head's; the attention half the heads'.
  const double per_rank = report_value(tp2, "fwd flops per GPU");
  CHECK(std::abs(2 * per_rank - flops) < 0.05 * flops);
}

TEST_CASE("train_cnn: Fashion-MNIST on 2 ranks with ZeRO 2 lowers the loss") {
  auto r = run_example(TESSERA_TRAIN_CNN_PATH, 2,
                       R"({"train_micro_batch_size_per_gpu": 32, "steps_per_print": 10,
                           "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
                           "zero_optimization": {"stage": 2}})",
                       30, tessera::testing::free_port());
  INFO(r.output);
  REQUIRE(r.status == 0);
  // ZeRO-3 with every layer partitioned and released after use: the same losses as ZeRO-2.
  auto z3 = run_example(TESSERA_TRAIN_CNN_PATH, 2,
                        R"({"train_micro_batch_size_per_gpu": 32, "steps_per_print": 10,
                            "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
                            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                                  "stage3_max_reuse_distance": 0, "stage3_max_live_parameters": 500000,
                                                  "stage3_prefetch_bucket_size": 300000}})",
                        30, tessera::testing::free_port());
  INFO(z3.output);
  REQUIRE(z3.status == 0);
  CHECK(std::abs(final_loss(z3.output) - final_loss(r.output)) < 1e-4);
  CHECK(final_loss(r.output) > 0);
  CHECK(final_loss(r.output) < 1.5);  // from ln(10) = 2.30
}
