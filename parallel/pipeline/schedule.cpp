#include "parallel/pipeline/schedule.h"

#include <algorithm>
#include <ostream>
#include <stdexcept>

namespace tessera::pipeline {

const char* op_name(Op op) {
  switch (op) {
    case Op::LoadMicroBatch: return "LoadMicroBatch";
    case Op::RecvActivation: return "RecvActivation";
    case Op::Forward: return "Forward";
    case Op::SendActivation: return "SendActivation";
    case Op::RecvGrad: return "RecvGrad";
    case Op::Backward: return "Backward";
    case Op::SendGrad: return "SendGrad";
    case Op::BackwardWeight: return "BackwardWeight";
    case Op::ReduceTiedGrads: return "ReduceTiedGrads";
    case Op::OptimizerStep: return "OptimizerStep";
  }
  return "?";
}

std::string to_string(const Instruction& i) {
  std::string s = op_name(i.op);
  if (i.micro_batch >= 0) s += "(" + std::to_string(i.micro_batch) + (i.chunk ? ", chunk " + std::to_string(i.chunk) : "") + ")";
  return s;
}

std::ostream& operator<<(std::ostream& out, const Instruction& i) { return out << to_string(i); }

int ChunkLayout::model_chunk(int s, int chunk) const {
  if (placement == Placement::V) return chunk == 0 ? s : 2 * stages - 1 - s;
  return s + chunk * stages;
}

std::pair<int, int> ChunkLayout::place(int g) const {
  if (placement == Placement::V) return g < stages ? std::pair{g, 0} : std::pair{2 * stages - 1 - g, 1};
  return {g % stages, g / stages};
}

std::vector<Instruction> forward_pass(int s, const ChunkLayout& layout, int mb, int chunk) {
  const bool first = layout.first(s, chunk), last = layout.last(s, chunk);
  std::vector<Instruction> out;
  if (layout.loads(s, chunk)) out.push_back({Op::LoadMicroBatch, mb, chunk});  // inputs / labels
  if (!first) out.push_back({Op::RecvActivation, mb, chunk});
  out.push_back({Op::Forward, mb, chunk});
  if (!last) out.push_back({Op::SendActivation, mb, chunk});
  return out;
}

std::vector<Instruction> backward_pass(int s, const ChunkLayout& layout, int mb, int chunk) {
  const bool first = layout.first(s, chunk), last = layout.last(s, chunk);
  std::vector<Instruction> out;
  if (!last) out.push_back({Op::RecvGrad, mb, chunk});
  out.push_back({Op::Backward, mb, chunk});
  if (!first) out.push_back({Op::SendGrad, mb, chunk});
  return out;
}

namespace {

void check_sizes(const char* what, int stages, int micro_batches) {
  if (stages < 1)
    throw std::invalid_argument(std::string(what) + ": pipeline.stages must be >= 1, got " + std::to_string(stages));
  if (micro_batches < 1)
    throw std::invalid_argument(std::string(what) + ": pipeline.micro_batches (gradient_accumulation_steps) must be >= 1, got " +
                                std::to_string(micro_batches));
}

void append(std::vector<Instruction>& to, const std::vector<Instruction>& more) { to.insert(to.end(), more.begin(), more.end()); }

void finish(std::vector<Instruction>& program) {
  program.push_back({Op::ReduceTiedGrads});
  program.push_back({Op::OptimizerStep});
}

}  // namespace

Schedule gpipe(int stages, int micro_batches) {
  check_sizes("gpipe", stages, micro_batches);
  Schedule schedule{"gpipe", stages, micro_batches, std::vector<std::vector<Instruction>>(stages)};
  for (int s = 0; s < stages; ++s) {
    std::vector<Instruction>& program = schedule.stage[s];
    for (int mb = 0; mb < micro_batches; ++mb) append(program, forward_pass(s, stages, mb));
    // Backwards in reverse order of the forwards would free the newest activations first; in order
    // they reach the first stage sooner. Either is GPipe; in order matches 1F1B's cool-down.
    for (int mb = 0; mb < micro_batches; ++mb) append(program, backward_pass(s, stages, mb));
    finish(program);
  }
  return schedule;
}

Schedule forward_only(int stages, int micro_batches, int chunks, Placement placement) {
  check_sizes("forward_only", stages, micro_batches);
  Schedule schedule{"forward_only", stages, micro_batches, std::vector<std::vector<Instruction>>(stages), false};
  schedule.chunks = chunks;
  schedule.placement = placement;
  for (int s = 0; s < stages; ++s)
    for (int c = 0; c < chunks; ++c)
      for (int mb = 0; mb < micro_batches; ++mb) append(schedule.stage[s], forward_pass(s, schedule.layout(), mb, c));
  return schedule;
}

Schedule one_f_one_b(int stages, int micro_batches) {
  check_sizes("1f1b", stages, micro_batches);
  Schedule schedule{"1f1b", stages, micro_batches, std::vector<std::vector<Instruction>>(stages)};
  for (int s = 0; s < stages; ++s) {
    std::vector<Instruction>& program = schedule.stage[s];
    // Warm-up: enough forwards that the first backward reaches this stage just as it is ready for it.
    const int warmup = std::min(stages - s - 1, micro_batches);
    const int steady = micro_batches - warmup;
    int next_forward = 0, next_backward = 0;
    for (int i = 0; i < warmup; ++i) append(program, forward_pass(s, stages, next_forward++));
    // Steady state: one forward, then the backward of the oldest micro-batch in flight.
    for (int i = 0; i < steady; ++i) {
      append(program, forward_pass(s, stages, next_forward++));
      append(program, backward_pass(s, stages, next_backward++));
    }
    // Cool-down: the backwards of the warm-up's micro-batches.
    while (next_backward < micro_batches) append(program, backward_pass(s, stages, next_backward++));
    finish(program);
  }
  return schedule;
}

Schedule interleaved_one_f_one_b(int stages, int micro_batches, int chunks) {
  check_sizes("interleaved_1f1b", stages, micro_batches);
  if (chunks < 1)
    throw std::invalid_argument("interleaved_1f1b: pipeline.virtual_stages must be >= 1, got " + std::to_string(chunks));
  if (chunks == 1) {  // one chunk per stage is 1F1B itself (its warm-up needs no room for a wrap-around)
    Schedule plain = one_f_one_b(stages, micro_batches);
    plain.name = "interleaved_1f1b";
    return plain;
  }
  if (micro_batches % stages != 0)
    throw std::invalid_argument("interleaved_1f1b: pipeline.micro_batches (gradient_accumulation_steps) " +
                                std::to_string(micro_batches) + " must be a multiple of pipeline.stages " +
                                std::to_string(stages) + " (micro-batches go through the chunks in groups of p)");
  const int p = stages, v = chunks, units = micro_batches * chunks;
  Schedule schedule{"interleaved_1f1b", p, micro_batches, std::vector<std::vector<Instruction>>(p)};
  schedule.chunks = v;
  // The k-th forward (backward) a stage runs: micro-batch group k / (p·v), chunk (k / p) mod v
  // (backwards from the last chunk), the group's (k mod p)-th micro-batch.
  auto micro_batch = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto forward_chunk = [&](int k) { return (k / p) % v; };
  auto backward_chunk = [&](int k) { return v - 1 - (k / p) % v; };
  for (int s = 0; s < p; ++s) {
    std::vector<Instruction>& program = schedule.stage[s];
    // Warm-up: the chunk forwards that run before this stage's first backward can arrive.
    const int warmup = std::min((p - s - 1) * 2 + (v - 1) * p, units);
    int next_forward = 0, next_backward = 0;
    auto forward = [&] {
      const int k = next_forward++;
      append(program, forward_pass(s, p, micro_batch(k), forward_chunk(k), v));
    };
    auto backward = [&] {
      const int k = next_backward++;
      append(program, backward_pass(s, p, micro_batch(k), backward_chunk(k), v));
    };
    for (int i = 0; i < warmup; ++i) forward();
    for (int i = warmup; i < units; ++i) {  // steady state: one forward, one backward
      forward();
      backward();
    }
    while (next_backward < units) backward();  // cool-down
    finish(program);
  }
  return schedule;
}

Schedule zb_h1(int stages, int micro_batches) {
  check_sizes("zb_h1", stages, micro_batches);
  const int p = stages, m = micro_batches;
  Schedule schedule{"zb_h1", p, m, std::vector<std::vector<Instruction>>(p)};
  schedule.split_backward = true;
  for (int s = 0; s < p; ++s) {
    std::vector<Instruction>& program = schedule.stage[s];
    const int warmup = std::min(p - s - 1, m);
    int next_forward = 0, next_backward = 0, next_weight = 0;
    auto weight = [&] { program.push_back({Op::BackwardWeight, next_weight++}); };
    for (int i = 0; i < warmup; ++i) append(program, forward_pass(s, p, next_forward++));
    // Steady state: F, B, and a W once s of them wait (stage s may hold s more micro-batches than
    // 1F1B's p − s, so every stage holds at most p).
    for (int i = warmup; i < m; ++i) {
      append(program, forward_pass(s, p, next_forward++));
      append(program, backward_pass(s, p, next_backward++));
      if (next_backward - next_weight > s) weight();
    }
    // Cool-down: each B's wait for the next gradient is filled with a deferred W; the rest after.
    while (next_backward < m) {
      append(program, backward_pass(s, p, next_backward++));
      weight();
    }
    while (next_weight < m) weight();
    finish(program);
  }
  return schedule;
}

Schedule zb_v(int stages, int micro_batches) {
  check_sizes("zb_v", stages, micro_batches);
  const int p = stages, m = micro_batches, limit = 2 * p;  // chunk activations held: 1F1B's peak
  Schedule schedule{"zb_v", p, m, std::vector<std::vector<Instruction>>(p)};
  schedule.chunks = 2;
  schedule.split_backward = true;
  schedule.placement = Placement::V;
  const ChunkLayout layout = schedule.layout();
  // The list scheduler: time in units of one chunk's F (= B = W), but as the executor runs the
  // model's first chunk: it sends no input gradient, so its B is empty and its W the whole backward
  // (2). When each model chunk's forward and B of each micro-batch finished (-1: not yet).
  std::vector<std::vector<double>> forward_done(2 * p, std::vector<double>(m, -1)), input_grad_done = forward_done;
  struct StageState {
    double free_at = 0;
    int next_forward[2] = {0, 0}, next_backward[2] = {0, 0};
    std::vector<std::pair<int, int>> deferred;  // (micro-batch, chunk) whose W waits, oldest first
    int held = 0;                               // chunk activations from F to W
  };
  std::vector<StageState> state(p);
  struct Choice {
    Op op;
    int chunk, micro_batch;
    double ready;
  };
  // Stage s's candidates in priority order: B's (chunk 1 first: its gradient feeds a stage that
  // still has a B to run), F's (chunk 1 first: nearer the loss), then the oldest deferred W.
  auto candidates = [&](int s) {
    std::vector<Choice> out;
    const StageState& st = state[s];
    for (int c : {1, 0}) {
      const int mb = st.next_backward[c], g = layout.model_chunk(s, c);
      if (mb >= m || forward_done[g][mb] < 0) continue;
      const double ready = g == 2 * p - 1 ? forward_done[g][mb] : input_grad_done[g + 1][mb];
      if (ready >= 0) out.push_back({Op::Backward, c, mb, ready});
    }
    for (int c : {1, 0}) {
      const int mb = st.next_forward[c], g = layout.model_chunk(s, c);
      if (mb >= m || st.held >= limit) continue;
      const double ready = g == 0 ? 0.0 : forward_done[g - 1][mb];
      if (ready >= 0) out.push_back({Op::Forward, c, mb, ready});
    }
    if (!st.deferred.empty()) out.push_back({Op::BackwardWeight, st.deferred.front().second, st.deferred.front().first, 0.0});
    return out;
  };
  for (int remaining = 3 * 2 * m * p; remaining > 0; --remaining) {
    // The stage that can start something soonest runs it: the first candidate ready when the stage
    // is free, else the one that becomes ready first.
    int best_stage = -1;
    Choice best{};
    double best_start = 0;
    for (int s = 0; s < p; ++s) {
      const std::vector<Choice> options = candidates(s);
      if (options.empty()) continue;
      const double now = state[s].free_at;
      auto it = std::find_if(options.begin(), options.end(), [&](const Choice& c) { return c.ready <= now; });
      const Choice pick = it != options.end()
                              ? *it
                              : *std::min_element(options.begin(), options.end(),
                                                  [](const Choice& a, const Choice& b) { return a.ready < b.ready; });
      const double start = std::max(now, pick.ready);
      if (best_stage < 0 || start < best_start) best_stage = s, best = pick, best_start = start;
    }
    // Not reached on the grid the tests run (p <= 8, m <= 33): a stage at its limit has W's to run.
    if (best_stage < 0) throw std::logic_error("zb_v: the list scheduler found nothing to run");
    StageState& st = state[best_stage];
    const int g = layout.model_chunk(best_stage, best.chunk), mb = best.micro_batch;
    std::vector<Instruction>& program = schedule.stage[best_stage];
    st.free_at = best_start + (g != 0 ? 1.0 : best.op == Op::Backward ? 0.0 : best.op == Op::BackwardWeight ? 2.0 : 1.0);
    switch (best.op) {
      case Op::Forward:
        append(program, forward_pass(best_stage, layout, mb, best.chunk));
        forward_done[g][mb] = st.free_at;
        ++st.next_forward[best.chunk];
        ++st.held;
        break;
      case Op::Backward:
        append(program, backward_pass(best_stage, layout, mb, best.chunk));
        input_grad_done[g][mb] = st.free_at;
        ++st.next_backward[best.chunk];
        st.deferred.push_back({mb, best.chunk});
        break;
      default:
        program.push_back({Op::BackwardWeight, mb, best.chunk});
        st.deferred.erase(st.deferred.begin());
        --st.held;
        break;
    }
  }
  for (std::vector<Instruction>& program : schedule.stage) finish(program);
  return schedule;
}

Placement placement_of(const std::string& schedule) { return schedule == "zb_v" ? Placement::V : Placement::Loop; }

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names{"1f1b", "gpipe", "interleaved_1f1b", "zb_h1", "zb_v"};
  return names;
}

Schedule make_schedule(const std::string& name, int stages, int micro_batches, int chunks) {
  if (name == "interleaved_1f1b") return interleaved_one_f_one_b(stages, micro_batches, chunks);
  if (name == "zb_v") {
    if (chunks != 2)
      throw std::invalid_argument("pipeline.virtual_stages: \"zb_v\" places 2 model chunks on each stage (a V); set "
                                  "pipeline.virtual_stages to 2, got " + std::to_string(chunks));
    return zb_v(stages, micro_batches);
  }
  if (chunks != 1)
    throw std::invalid_argument("pipeline.virtual_stages: " + std::to_string(chunks) + " model chunks per stage need "
                                "pipeline.schedule \"interleaved_1f1b\" (or 2 with \"zb_v\"), got \"" + name + "\"");
  if (name == "1f1b") return one_f_one_b(stages, micro_batches);
  if (name == "gpipe") return gpipe(stages, micro_batches);
  if (name == "zb_h1") return zb_h1(stages, micro_batches);
  throw std::invalid_argument("pipeline.schedule: expected \"1f1b\", \"gpipe\", \"interleaved_1f1b\", \"zb_h1\" or \"zb_v\", got \"" +
                              name + "\"");
}

}  // namespace tessera::pipeline
