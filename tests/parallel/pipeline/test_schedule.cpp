// Pipeline schedules as instruction lists (parallel/pipeline/schedule.h), checked and timed by the
// simulator (simulator.h) against the closed forms: every micro-batch's forward and backward once
// per stage, no deadlock, the idle fraction (p − 1) / (m + p − 1) with equal stage costs, and the
// activations held (1F1B: min(p − s, m) on stage s; GPipe: m). And the layer partitioning
// (partition.h) against an exhaustive search.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <random>
#include <stdexcept>

#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/simulator.h"

using namespace tessera::pipeline;

namespace {

std::vector<std::string> names(const std::vector<Instruction>& program) {
  std::vector<std::string> out;
  for (const Instruction& i : program) out.push_back(to_string(i));
  return out;
}

bool mentions(const std::vector<std::string>& errors, const std::string& part) {
  return std::any_of(errors.begin(), errors.end(), [&](const std::string& e) { return e.find(part) != std::string::npos; });
}

}  // namespace

TEST_CASE("1f1b: stage 0 of 2 with 3 micro-batches warms up once - alternates - then drains", "[pipeline]") {
  const Schedule s = one_f_one_b(2, 3);
  CHECK(names(s.stage[0]) == std::vector<std::string>{
                                 "LoadMicroBatch(0)", "Forward(0)", "SendActivation(0)",                       // warm-up
                                 "LoadMicroBatch(1)", "Forward(1)", "SendActivation(1)", "RecvGrad(0)", "Backward(0)",
                                 "LoadMicroBatch(2)", "Forward(2)", "SendActivation(2)", "RecvGrad(1)", "Backward(1)",
                                 "RecvGrad(2)", "Backward(2)",                                                 // cool-down
                                 "ReduceTiedGrads", "OptimizerStep"});
  // The last stage has no warm-up: forward, backward, forward, backward ...
  CHECK(names(s.stage[1]) == std::vector<std::string>{
                                 "LoadMicroBatch(0)", "RecvActivation(0)", "Forward(0)", "Backward(0)", "SendGrad(0)",
                                 "LoadMicroBatch(1)", "RecvActivation(1)", "Forward(1)", "Backward(1)", "SendGrad(1)",
                                 "LoadMicroBatch(2)", "RecvActivation(2)", "Forward(2)", "Backward(2)", "SendGrad(2)",
                                 "ReduceTiedGrads", "OptimizerStep"});
}

TEST_CASE("1f1b and gpipe: well formed - no deadlock - the closed-form bubble and activations", "[pipeline]") {
  for (int p : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 3, 4, 7, 8, 16, 33}) {
      for (const Costs& costs : {Costs{}, Costs{1.0, 2.0}}) {  // backward = forward, and twice the forward
        const double bubble = double(p - 1) / double(m + p - 1);
        const Schedule f1b1 = one_f_one_b(p, m), pipe = gpipe(p, m);
        INFO("p " << p << " m " << m << " backward cost " << costs.backward);
        CHECK(check(f1b1).empty());
        CHECK(check(pipe).empty());
        const Simulation a = simulate(f1b1, costs), g = simulate(pipe, costs);
        CHECK(a.makespan == Approx((m + p - 1) * (costs.forward + costs.backward)));
        for (int s = 0; s < p; ++s) {
          INFO("stage " << s);
          CHECK(a.idle_fraction[s] == Approx(bubble).margin(1e-12));
          CHECK(g.idle_fraction[s] == Approx(bubble).margin(1e-12));
          CHECK(a.peak_activations[s] == std::min(p - s, m));  // the first stage: at most p
          CHECK(g.peak_activations[s] == m);
        }
      }
    }
}

TEST_CASE("interleaved 1f1b: 2 stages x 2 chunks - chunk 1 of the last stage loads the labels - the wrap-around", "[pipeline]") {
  const Schedule s = interleaved_one_f_one_b(2, 2, 2);
  CHECK(s.chunks == 2);
  // Stage 0 warms up with (2 - 0 - 1)·2 + (2 - 1)·2 = 4 chunk forwards: micro-batches 0 and 1
  // through chunk 0, then through chunk 2 of the model (its chunk 1), receiving them from stage 1.
  CHECK(names(s.stage[0]) == std::vector<std::string>{
                                 "LoadMicroBatch(0)", "Forward(0)", "SendActivation(0)",
                                 "LoadMicroBatch(1)", "Forward(1)", "SendActivation(1)",
                                 "RecvActivation(0, chunk 1)", "Forward(0, chunk 1)", "SendActivation(0, chunk 1)",
                                 "RecvActivation(1, chunk 1)", "Forward(1, chunk 1)", "SendActivation(1, chunk 1)",
                                 "RecvGrad(0, chunk 1)", "Backward(0, chunk 1)", "SendGrad(0, chunk 1)",
                                 "RecvGrad(1, chunk 1)", "Backward(1, chunk 1)", "SendGrad(1, chunk 1)",
                                 "RecvGrad(0)", "Backward(0)", "RecvGrad(1)", "Backward(1)",
                                 "ReduceTiedGrads", "OptimizerStep"});
  // The last stage's chunk 1 is the model's last: it loads the labels and sends no activation on.
  CHECK(names(s.stage[1])[0] == "RecvActivation(0)");
  CHECK(std::count(s.stage[1].begin(), s.stage[1].end(), Instruction{Op::LoadMicroBatch, 0, 1}) == 1);
  CHECK(std::count(s.stage[1].begin(), s.stage[1].end(), Instruction{Op::SendActivation, 0, 1}) == 0);
}

TEST_CASE("interleaved 1f1b: well formed - no deadlock - the idle fraction (p - 1) / (v·m + p - 1) - activations", "[pipeline]") {
  for (int p : {1, 2, 3, 4, 8})
    for (int groups : {1, 2, 3, 4})
      for (int v : {1, 2, 3, 4}) {
        const int m = groups * p;
        INFO("p " << p << " m " << m << " v " << v);
        const Schedule s = interleaved_one_f_one_b(p, m, v);
        REQUIRE(check(s).empty());
        CHECK(stream_order_errors(s).empty());  // the transport's ordered streams can carry it
        const Simulation sim = simulate(s);
        const double bubble = double(p - 1) / double(v * m + p - 1);
        for (int stage = 0; stage < p; ++stage) {
          INFO("stage " << stage);
          CHECK(sim.idle_fraction[stage] == Approx(bubble).margin(1e-12));
          // Activations: the warm-up's chunk forwards plus the one in steady state, each 1/v of a stage
          // (v = 1: 1F1B's min(p - s, m)).
          CHECK(sim.peak_activations[stage] ==
                (v == 1 ? std::min(p - stage, m) : std::min((p - stage - 1) * 2 + (v - 1) * p + 1, m * v)));
        }
        // v = 1 is 1F1B itself; more chunks divide the bubble by about v.
        if (v == 1) CHECK(s.stage == one_f_one_b(p, m).stage);
        CHECK(sim.makespan == Approx(m * 2.0 + (p - 1) * 2.0 / v));
      }
}

TEST_CASE("zb_h1: well formed - B before W - idle (p - 1)(F + B - W) per stage - 1F1B's peak activations", "[pipeline]") {
  Costs costs;  // F = B = W, the paper's assumption: a whole backward costs 2F, half of it W
  costs.forward = 1.0;
  costs.backward = 2.0;
  for (int p : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 3, 4, 7, 8, 16, 33}) {
      INFO("p " << p << " m " << m);
      const Schedule zb = zb_h1(p, m);
      REQUIRE(check(zb).empty());
      CHECK(stream_order_errors(zb).empty());
      const Simulation z = simulate(zb, costs), one = simulate(one_f_one_b(p, m), costs);
      if (m >= p) {
        // 1F1B: (m + p - 1)(F + B + W); ZB-H1 closes all but (p - 1)(F + B - W) of the bubble.
        CHECK(z.makespan == Approx(3.0 * m + (p - 1) * 1.0));
      }
      CHECK(z.makespan <= one.makespan + 1e-9);
      const int peak = *std::max_element(one.peak_activations.begin(), one.peak_activations.end());
      for (int s = 0; s < p; ++s) {
        INFO("stage " << s);
        CHECK(z.peak_activations[s] <= peak);  // the pipeline's peak stays 1F1B's
        if (p > 1 && m >= p) CHECK(z.idle_fraction[s] < one.idle_fraction[s]);
      }
    }
  // A schedule whose W comes before its B is refused.
  Schedule bad = zb_h1(2, 2);
  auto& program = bad.stage[0];  // the first stage: B(0) sends nothing
  auto b = std::find(program.begin(), program.end(), Instruction{Op::Backward, 0});
  auto w = std::find(program.begin(), program.end(), Instruction{Op::BackwardWeight, 0});
  std::iter_swap(b, w);
  CHECK_THAT(check(bad).front(), Catch::Contains("BackwardWeight(0) comes before Backward(0)"));
}

TEST_CASE("zb_v: the V placement - stage 0 loads once and computes the loss - the turn stays on the last stage", "[pipeline]") {
  const ChunkLayout v{3, 2, Placement::V};
  CHECK(v.model_chunk(0, 0) == 0);
  CHECK(v.model_chunk(0, 1) == 5);
  CHECK(v.model_chunk(2, 0) == 2);
  CHECK(v.model_chunk(2, 1) == 3);
  for (int g = 0; g < 6; ++g) CHECK(v.model_chunk(v.place(g).first, v.place(g).second) == g);
  CHECK(v.last_stage() == 0);
  CHECK(v.next_stage(2, 0) == 2);  // the turn: chunk 2's output goes to chunk 3 on the same stage
  CHECK(v.previous_stage(1, 1) == 2);
  const ChunkLayout loop{3, 2, Placement::Loop};
  CHECK(loop.model_chunk(1, 1) == 4);
  CHECK(loop.last_stage() == 2);
  CHECK(loop.next_stage(2, 0) == 0);  // the wrap-around

  const Schedule zb = zb_v(2, 3);
  CHECK(zb.chunks == 2);
  CHECK(zb.split_backward);
  // Stage 0 holds the model's first and last chunks: one load per micro-batch, before chunk 0's
  // forward; no activation crosses off either end.
  const auto& first = zb.stage[0];
  CHECK(std::count_if(first.begin(), first.end(), [](const Instruction& i) { return i.op == Op::LoadMicroBatch; }) == 3);
  CHECK(std::count(first.begin(), first.end(), Instruction{Op::LoadMicroBatch, 0, 0}) == 1);
  CHECK(std::count(first.begin(), first.end(), Instruction{Op::SendActivation, 0, 1}) == 0);
  CHECK(std::count(first.begin(), first.end(), Instruction{Op::SendGrad, 0, 0}) == 0);
  // The last stage sends chunk 0's output to its own chunk 1 (the executor hands it over in-process).
  CHECK(matching_send(zb.layout(), Instruction{Op::RecvActivation, 0, 1}, 1).stage == 1);
  CHECK(matching_send(zb.layout(), Instruction{Op::RecvGrad, 0, 0}, 1).stage == 1);
  CHECK(matching_send(zb.layout(), Instruction{Op::RecvGrad, 0, 1}, 1).stage == 0);  // chunk 3's gradient back up the V
  // Cut 8 layers into 4 chunks: stage 0 runs layers 0-1 and 6-7, stage 1 layers 2-3 and 4-5.
  const std::vector<int> bounds{0, 2, 4, 6, 8};
  CHECK(stage_layer_ranges(bounds, 0, 2, Placement::V) == std::vector<std::pair<int, int>>{{0, 2}, {6, 8}});
  CHECK(stage_layer_ranges(bounds, 1, 2, Placement::V) == std::vector<std::pair<int, int>>{{2, 4}, {4, 6}});
  CHECK(stage_layer_ranges(bounds, 1, 2) == std::vector<std::pair<int, int>>{{2, 4}, {6, 8}});
}

TEST_CASE("zb_v: well formed - no deadlock - 1F1B's peak activations - a fraction of ZB-H1's bubble", "[pipeline]") {
  Costs costs;  // F = B = W
  costs.forward = 1.0;
  costs.backward = 2.0;
  for (int p : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 3, 4, 7, 8, 16, 33}) {
      INFO("p " << p << " m " << m);
      const Schedule zb = zb_v(p, m);
      REQUIRE(check(zb).empty());
      CHECK(stream_order_errors(zb).empty());
      const Simulation v = simulate(zb, costs), h1 = simulate(zb_h1(p, m), costs), one = simulate(one_f_one_b(p, m), costs);
      // Chunk activations are half a stage's: at most 1F1B's peak of whole micro-batches, 2p chunks.
      const int peak = *std::max_element(one.peak_activations.begin(), one.peak_activations.end());
      for (int s = 0; s < p; ++s) CHECK(v.peak_activations[s] <= 2 * peak);
      CHECK(v.makespan <= one.makespan + 1e-9);
      if (p > 1 && m >= 2 * p) {
        // Timed as the executor runs it (the model's first chunk: no B, its whole backward at W),
        // never slower than ZB-H1 and faster from p = 4; the bubble left within four chunk
        // forwards of the p − 1 before the first micro-batch reaches the last stage (at p = 2
        // and 4: within one), against ZB-H1's (p − 1)(F + B − W).
        CHECK(v.makespan <= h1.makespan + 1e-9);
        if (p >= 4) CHECK(v.makespan < h1.makespan);
        CHECK(h1.makespan - 3.0 * m == Approx((p - 1) * 1.0));
        CHECK(v.makespan - 3.0 * m <= (p - 1) * 0.5 + (p == 2 || p == 4 ? 0.5 : 2.0) + 1e-9);
      }
    }
  // The same lists run under other costs (a slow W, sends with latency) without deadlock.
  Costs other;
  other.weight_share = 0.8;
  other.send = 0.3;
  CHECK(simulate(zb_v(4, 8), other).makespan > 0);
}

TEST_CASE("simulator: a send costs the receiver its latency on every hop of the warm-up", "[pipeline]") {
  Costs costs;
  costs.send = 0.5;
  const Simulation sim = simulate(one_f_one_b(4, 8), costs);
  // At least the first forward's 3 hops down and the last backward's 3 hops up.
  CHECK(sim.makespan >= (8 + 3) * 2.0 + 2 * 3 * 0.5);
  // The timeline: stage 3 starts its first forward when stage 0's output has crossed three links.
  const auto& first = *std::find_if(sim.timeline[3].begin(), sim.timeline[3].end(),
                                    [](const TimedInstruction& t) { return t.instruction.op == Op::Forward; });
  CHECK(first.start == Approx(3 * (1.0 + 0.5)));
}

TEST_CASE("simulator: malformed schedules are refused with what is wrong", "[pipeline]") {
  auto errors_after = [](const std::function<void(Schedule&)>& edit) {
    Schedule s = one_f_one_b(3, 4);
    edit(s);
    return check(s);
  };
  auto find = [](std::vector<Instruction>& program, Instruction i) { return std::find(program.begin(), program.end(), i); };
  CHECK(mentions(errors_after([&](Schedule& s) { s.stage[1].erase(find(s.stage[1], {Op::Backward, 2})); }),
                 "stage 1: Backward(2) must appear once, found 0"));
  CHECK(mentions(errors_after([&](Schedule& s) { s.stage[0].insert(s.stage[0].begin() + 1, {Op::Forward, 0}); }),
                 "stage 0: Forward(0) must appear once, found 2"));
  CHECK(mentions(errors_after([&](Schedule& s) { s.stage[2].insert(s.stage[2].begin() + 3, {Op::SendActivation, 0}); }),
                 "stage 2: SendActivation(0) has no peer at this end of the pipeline"));
  CHECK(mentions(errors_after([&](Schedule& s) {  // stage 1 sends an activation before computing it
                   auto send = find(s.stage[1], {Op::SendActivation, 1});
                   std::iter_swap(send, find(s.stage[1], {Op::Forward, 1}));
                 }),
                 "stage 1: SendActivation(1) comes before Forward(1)"));
  CHECK(mentions(errors_after([&](Schedule& s) { s.stage[0].pop_back(); }), "stage 0: must end with ReduceTiedGrads then OptimizerStep"));
  CHECK(mentions(errors_after([&](Schedule& s) { s.stage[0][1].micro_batch = 9; }), "outside 0..3"));
  Schedule broken = one_f_one_b(2, 2);
  broken.stage[1].erase(find(broken.stage[1], {Op::Backward, 0}));
  CHECK_THROWS_WITH(simulate(broken), Catch::Contains("malformed") && Catch::Contains("Backward(0)"));
}

TEST_CASE("simulator: a well-formed schedule whose receives wait on each other is reported as a deadlock", "[pipeline]") {
  // Stage 0 waits for micro-batch 0's gradient before running its forward, which stage 1 needs
  // before it can send that gradient. Each list is fine on its own, and so are the streams' orders.
  Schedule s{"waits", 2, 1, {}};
  s.stage.push_back({{Op::LoadMicroBatch, 0}, {Op::RecvGrad, 0}, {Op::Forward, 0}, {Op::SendActivation, 0}, {Op::Backward, 0},
                     {Op::ReduceTiedGrads}, {Op::OptimizerStep}});
  s.stage.push_back({{Op::LoadMicroBatch, 0}, {Op::RecvActivation, 0}, {Op::Forward, 0}, {Op::Backward, 0}, {Op::SendGrad, 0},
                     {Op::ReduceTiedGrads}, {Op::OptimizerStep}});
  CHECK(check(s).empty());
  CHECK(stream_order_errors(s).empty());
  CHECK_THROWS_WITH(simulate(s), Catch::Contains("deadlocks") && Catch::Contains("stage 0 waits at instruction 1, RecvGrad(0)") &&
                                     Catch::Contains("stage 1 waits at instruction 1, RecvActivation(0)"));
}

TEST_CASE("simulator: a stream sent in another order than it is received is refused (the transport matches in order)", "[pipeline]") {
  // Stage 0 sends micro-batch 0's activation, then 1's; stage 1 wants 1 first.
  Schedule s{"crossed", 2, 2, {}};
  s.stage.push_back({{Op::LoadMicroBatch, 0}, {Op::Forward, 0}, {Op::SendActivation, 0}, {Op::RecvGrad, 0}, {Op::Backward, 0},
                     {Op::LoadMicroBatch, 1}, {Op::Forward, 1}, {Op::SendActivation, 1}, {Op::RecvGrad, 1}, {Op::Backward, 1},
                     {Op::ReduceTiedGrads}, {Op::OptimizerStep}});
  s.stage.push_back({{Op::LoadMicroBatch, 1}, {Op::RecvActivation, 1}, {Op::Forward, 1}, {Op::Backward, 1}, {Op::SendGrad, 1},
                     {Op::LoadMicroBatch, 0}, {Op::RecvActivation, 0}, {Op::Forward, 0}, {Op::Backward, 0}, {Op::SendGrad, 0},
                     {Op::ReduceTiedGrads}, {Op::OptimizerStep}});
  CHECK(check(s).empty());
  CHECK(mentions(stream_order_errors(s), "stage 0 sends its activations to stage 1 in another order than stage 1 receives them"));
  CHECK(mentions(stream_order_errors(s), "stage 1 sends its gradients to stage 0 in another order"));
  CHECK(stream_order_errors(one_f_one_b(4, 8)).empty());
  CHECK(stream_order_errors(gpipe(4, 8)).empty());
  CHECK_THROWS_WITH(simulate(s), Catch::Contains("malformed") && Catch::Contains("another order"));
}

TEST_CASE("make_schedule: by the config's name - and bad sizes and names are errors naming the key", "[pipeline]") {
  CHECK(make_schedule("1f1b", 4, 8).stage == one_f_one_b(4, 8).stage);
  CHECK(make_schedule("gpipe", 4, 8).stage == gpipe(4, 8).stage);
  CHECK_THROWS_WITH(make_schedule("interleaved", 4, 8), Catch::Contains("pipeline.schedule") && Catch::Contains("\"1f1b\"") &&
                                                           Catch::Contains("\"interleaved_1f1b\""));
  CHECK(make_schedule("interleaved_1f1b", 4, 8, 2).stage == interleaved_one_f_one_b(4, 8, 2).stage);
  CHECK_THROWS_WITH(make_schedule("interleaved_1f1b", 4, 6, 2),
                    Catch::Contains("pipeline.micro_batches (gradient_accumulation_steps) 6 must be a multiple of pipeline.stages 4"));
  CHECK_THROWS_WITH(make_schedule("1f1b", 4, 8, 2), Catch::Contains("pipeline.virtual_stages") && Catch::Contains("interleaved_1f1b"));
  CHECK(make_schedule("zb_v", 4, 8, 2).stage == zb_v(4, 8).stage);
  CHECK_THROWS_WITH(make_schedule("zb_v", 4, 8, 3), Catch::Contains("pipeline.virtual_stages") && Catch::Contains("got 3"));
  CHECK_THROWS_WITH(make_schedule("1f1b", 4, 0), Catch::Contains("pipeline.micro_batches") && Catch::Contains("got 0"));
  CHECK_THROWS_WITH(make_schedule("gpipe", 0, 4), Catch::Contains("pipeline.stages"));
}

TEST_CASE("partition: uniform - by parameters - by layer type", "[pipeline]") {
  std::vector<LayerInfo> gpt{{"Embedding", 1000}};
  for (int i = 0; i < 8; ++i) gpt.push_back({"Block", 100});
  gpt.push_back({"LayerNorm", 2});
  gpt.push_back({"Head", 1000});
  CHECK(partition_layers(gpt, 4, "uniform") == std::vector<int>{0, 3, 6, 9, 11});
  // The embedding and the head are heavy: each gets a stage (the blocks and the norm share one).
  CHECK(partition_layers(gpt, 3, "parameters") == std::vector<int>{0, 1, 10, 11});
  // type:block balances the blocks (the others ride along with the nearest stage).
  const std::vector<int> by_type = partition_layers(gpt, 4, "type:block");
  for (int s = 0; s < 4; ++s) {
    int blocks = 0;
    for (int i = by_type[s]; i < by_type[s + 1]; ++i) blocks += gpt[i].type == "Block";
    CHECK(blocks == 2);
  }
  CHECK(describe_partition(gpt, {0, 1, 9, 11}) ==
        "stage 0: layers 0-0 (1000 parameters): 0:Embedding\n"
        "stage 1: layers 1-8 (800 parameters): 1:Block 2:Block 3:Block 4:Block 5:Block 6:Block 7:Block 8:Block\n"
        "stage 2: layers 9-10 (1002 parameters): 9:LayerNorm 10:Head\n");
}

TEST_CASE("partition_balanced: the smallest possible heaviest stage - against every cut", "[pipeline]") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 9), parts = 1 + static_cast<int>(rng() % n);
    std::vector<int64_t> w(n);
    for (auto& x : w) x = static_cast<int64_t>(rng() % 20);  // zeros too (layers without parameters)
    const std::vector<int> bounds = partition_balanced(w, parts);
    REQUIRE(bounds.size() == size_t(parts) + 1);
    CHECK(bounds.front() == 0);
    CHECK(bounds.back() == n);
    int64_t heaviest = 0;
    for (int s = 0; s < parts; ++s) {
      CHECK(bounds[s + 1] > bounds[s]);  // no empty stage
      int64_t sum = 0;
      for (int i = bounds[s]; i < bounds[s + 1]; ++i) sum += w[i];
      heaviest = std::max(heaviest, sum);
    }
    // Exhaustive: every way to choose parts − 1 cut points among n − 1.
    int64_t best = INT64_MAX;
    for (unsigned mask = 0; mask < (1u << (n - 1)); ++mask) {
      if (__builtin_popcount(mask) != parts - 1) continue;
      int64_t sum = 0, worst = 0;
      for (int i = 0; i < n; ++i) {
        sum += w[i];
        if (i == n - 1 || (mask >> i & 1)) {
          worst = std::max(worst, sum);
          sum = 0;
        }
      }
      best = std::min(best, worst);
    }
    INFO("trial " << trial << " n " << n << " parts " << parts);
    CHECK(heaviest == best);
  }
}

TEST_CASE("partition: bad input names the key and the sizes", "[pipeline]") {
  const std::vector<LayerInfo> three{{"Embedding", 10}, {"Block", 10}, {"Head", 10}};
  CHECK_THROWS_WITH(partition_layers(three, 4, "parameters"),
                    Catch::Contains("pipeline.stages: 4 stages for a model of 3 layers"));
  CHECK_THROWS_WITH(partition_layers(three, 2, "type:attention"),
                    Catch::Contains("pipeline.partition_method") && Catch::Contains("Embedding, Block, Head"));
  CHECK_THROWS_WITH(partition_layers(three, 2, "balanced"), Catch::Contains("expected \"parameters\", \"uniform\""));
}
