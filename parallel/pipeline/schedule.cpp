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

std::vector<Instruction> forward_pass(int s, int stages, int mb, int chunk, int chunks) {
  const bool first = s == 0 && chunk == 0, last = s == stages - 1 && chunk == chunks - 1;
  std::vector<Instruction> out;
  if (first || last) out.push_back({Op::LoadMicroBatch, mb, chunk});  // inputs / labels
  if (!first) out.push_back({Op::RecvActivation, mb, chunk});
  out.push_back({Op::Forward, mb, chunk});
  if (!last) out.push_back({Op::SendActivation, mb, chunk});
  return out;
}

std::vector<Instruction> backward_pass(int s, int stages, int mb, int chunk, int chunks) {
  const bool first = s == 0 && chunk == 0, last = s == stages - 1 && chunk == chunks - 1;
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

Schedule forward_only(int stages, int micro_batches, int chunks) {
  check_sizes("forward_only", stages, micro_batches);
  Schedule schedule{"forward_only", stages, micro_batches, std::vector<std::vector<Instruction>>(stages), false};
  schedule.chunks = chunks;
  for (int s = 0; s < stages; ++s)
    for (int c = 0; c < chunks; ++c)
      for (int mb = 0; mb < micro_batches; ++mb) append(schedule.stage[s], forward_pass(s, stages, mb, c, chunks));
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

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names{"1f1b", "gpipe", "interleaved_1f1b", "zb_h1"};
  return names;
}

Schedule make_schedule(const std::string& name, int stages, int micro_batches, int chunks) {
  if (name == "interleaved_1f1b") return interleaved_one_f_one_b(stages, micro_batches, chunks);
  if (chunks != 1)
    throw std::invalid_argument("pipeline.virtual_stages: " + std::to_string(chunks) + " model chunks per stage need "
                                "pipeline.schedule \"interleaved_1f1b\", got \"" + name + "\"");
  if (name == "1f1b") return one_f_one_b(stages, micro_batches);
  if (name == "gpipe") return gpipe(stages, micro_batches);
  if (name == "zb_h1") return zb_h1(stages, micro_batches);
  throw std::invalid_argument("pipeline.schedule: expected \"1f1b\", \"gpipe\", \"interleaved_1f1b\" or \"zb_h1\", got \"" +
                              name + "\"");
}

}  // namespace tessera::pipeline
