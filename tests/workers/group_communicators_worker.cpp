// The program each rank runs in tests/zero/test_group_communicators.cpp: parameter groups on
// communicators of their own (ParamGroup::communicator, ParallelContext::group_over), against a
// single-process reference.
//
//   tessera_group_communicators_worker --stage S [--steps N] [--gas G] [--clip C] [--bucket B]
//
// Four ranks, the data axis split into expert_data × expert (2 × 2, expert fastest). The model has
// three parameter groups, each averaged and partitioned over its own ranks:
//   dense    over "data"               (all 4 ranks: the data group itself)
//   experts  over "expert_data"        (ranks {0,2} hold expert 0, {1,3} expert 1: the parameters
//                                       differ across the expert factor, as an MoE layer's do)
//   head     over "expert_data*expert" (all 4 ranks again, as a communicator of its own)
// Rank r builds every tensor from seed 42 + r, so the engine must broadcast each group from rank 0
// of that group's communicator (a missing or misdirected broadcast fails the comparison).
//
// The reference runs every rank's micro-batches in one process and averages each parameter's
// gradient over the ranks of its group, divides by the accumulation steps, takes the global norm
// over every distinct parameter (both experts once), clips, and steps plain SGD (-lr·g: a wrong
// gradient scale shows). Checked: every micro-batch's loss, every step's gradient norm (1e-5
// relative), the final parameters (1e-5 relative), and each communicator's statistics: the
// gradients' bytes of each group on its own communicator and only there.
// Prints "groups ok: ..." on rank 0, else exits 1 with the reason.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/full.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/mse_loss.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/zeros_like.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "csrc/process_exit.h"
#include "engine/config/config_io.h"
#include "engine/engine.h"
#include "parallel/parallel_context.h"

using namespace tessera;

namespace {

constexpr int kRanks = 4, kExperts = 2;
constexpr double kLr = 0.5;

struct Args {
  int stage = 0, steps = 3, gas = 2, mb = 2, bucket = 100'000'000;
  double clip = 0.3;
};

// Every tensor of the global model: the dense layer, one expert per expert rank, the head.
struct GlobalModel {
  at::Tensor w1, b1, head;
  std::vector<at::Tensor> expert_w, expert_b;
  explicit GlobalModel(const std::vector<uint64_t>& seeds) {  // seeds: dense/head, expert 0, expert 1
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seeds[0]);
    w1 = (at::randn({16, 12}, gen) * 0.3).set_requires_grad(true);
    b1 = (at::randn({16}, gen) * 0.1).set_requires_grad(true);
    head = (at::randn({8, 16}, gen) * 0.25).set_requires_grad(true);
    for (int e = 0; e < kExperts; ++e) {
      auto g = at::make_generator<at::CPUGeneratorImpl>(seeds[1 + e] * 31 + 7);
      expert_w.push_back((at::randn({16, 16}, g) * 0.25).set_requires_grad(true));
      expert_b.push_back((at::randn({16}, g) * 0.1).set_requires_grad(true));
    }
  }
  std::vector<at::Tensor> all() const {
    return {w1, b1, expert_w[0], expert_b[0], expert_w[1], expert_b[1], head};
  }
};

// One rank's loss on its micro-batch, through expert `e`; units reported to `engine` when given.
at::Tensor loss_of(const GlobalModel& m, int e, const at::Tensor& x, const at::Tensor& y, Engine* engine) {
  auto enter = [&](int unit) { return engine ? std::optional<UnitScope>(engine->unit(unit)) : std::nullopt; };
  at::Tensor h, out;
  {
    auto scope = enter(0);
    h = at::tanh(at::linear(x, m.w1, m.b1));
  }
  {
    auto scope = enter(1);
    h = at::tanh(at::linear(h, m.expert_w[e], m.expert_b[e])) + h;
  }
  {
    auto scope = enter(2);
    out = at::linear(h, m.head);
  }
  return at::mse_loss(out, y);
}

std::pair<at::Tensor, at::Tensor> micro_batch(int step, int micro, int rank, int mb) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5000 + 97 * step + 13 * micro + rank);
  return {at::randn({mb, 12}, gen), at::randn({mb, 8}, gen) * 0.5};
}

void fail(const std::string& why) { throw std::runtime_error("check failed: " + why); }

std::string config_text(const Args& a) {
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                R"({"train_micro_batch_size_per_gpu": %d, "gradient_accumulation_steps": %d,
                    "optimizer": {"type": "SGD", "params": {"lr": %g, "momentum": 0.0, "weight_decay": 0.0}},
                    "gradient_clipping": %g, "steps_per_print": 1000,
                    "zero_optimization": {"stage": %d, "reduce_bucket_size": %d, "allgather_bucket_size": %d,
                                          "stage3_param_persistence_threshold": 0}})",
                a.mb, a.gas, kLr, a.clip, a.stage, a.bucket, a.bucket);
  return buf;
}

int64_t reduced_bytes(Communicator& c, int stage) {
  const auto& s = c.stats();
  auto it = s.find(stage == 0 ? "all_reduce" : "reduce_scatter");
  return it == s.end() ? 0 : it->second.bytes;
}

int run(const Args& a) {
  auto ctx = ParallelContext::from_environment(ParallelOptions{});
  if (ctx->world_size() != kRanks) fail("run on 4 ranks");
  const int rank = ctx->rank(), expert = rank % kExperts;
  ctx->split_axis("data", {{"expert_data", kRanks / kExperts}, {"expert", kExperts}});
  Communicator& expert_data = ctx->group_over("expert_data");
  if (expert_data.global_ranks() != std::vector<int>{expert, expert + 2})
    fail("expert_data group of rank " + std::to_string(rank));
  if (ctx->group_over("expert").global_ranks() != std::vector<int>{rank - expert, rank - expert + 1})
    fail("expert group of rank " + std::to_string(rank));

  Config config = load_config(config_text(a), kRanks);
  const uint64_t mine = 42 + rank;
  GlobalModel model({mine, mine, mine});
  ModelDescription d;
  // Each group field by field (a brace list would leave the later members to -Wmissing-field-initializers).
  auto group = [&](std::vector<at::Tensor> params, std::string name, std::vector<std::string> names,
                   std::string communicator) {
    ParamGroup g;
    g.params = std::move(params);
    g.name = std::move(name);
    g.param_names = std::move(names);
    g.communicator = std::move(communicator);
    d.groups.push_back(std::move(g));
  };
  group({model.w1, model.b1}, "dense", {"w1", "b1"}, "");
  group({model.expert_w[expert], model.expert_b[expert]}, "experts", {"expert.w", "expert.b"}, "expert_data");
  group({model.head}, "head", {"head"}, "expert_data*expert");
  d.units = {{"dense", {model.w1, model.b1}},
             {"expert", {model.expert_w[expert], model.expert_b[expert]}},
             {"head", {model.head}}};
  Engine engine(config, *ctx, std::move(d));
  Communicator& head_comm = ctx->group_over("expert_data*expert");
  if (&head_comm == &ctx->data()) fail("the product group is the data group's object");
  for (Communicator* c : {&ctx->data(), &expert_data, &head_comm}) c->reset_stats();  // construction's broadcasts

  // The reference: dense and head from rank 0's seed, expert e from rank e's (rank 0 of its group).
  GlobalModel ref({42, 42, 43});
  const std::vector<at::Tensor> ref_params = ref.all();
  double max_loss = 0, max_norm = 0;
  int clipped = 0;
  for (int step = 0; step < a.steps; ++step) {
    std::vector<at::Tensor> grads;
    for (const auto& p : ref_params) grads.push_back(at::zeros_like(p));
    for (int micro = 0; micro < a.gas; ++micro) {
      for (int r = 0; r < kRanks; ++r) {
        auto [x, y] = micro_batch(step, micro, r, a.mb);
        for (const auto& p : ref_params) p.mutable_grad() = at::Tensor();
        at::Tensor loss = loss_of(ref, r % kExperts, x, y, nullptr);
        loss.backward();
        for (size_t i = 0; i < ref_params.size(); ++i) {
          if (!ref_params[i].grad().defined()) continue;  // the other expert
          const bool is_expert = i >= 2 && i < 6;
          const int averaged_over = is_expert ? kRanks / kExperts : kRanks;
          grads[i].add_(ref_params[i].grad(), 1.0 / (averaged_over * a.gas));
        }
        if (r == rank) {
          auto [xe, ye] = micro_batch(step, micro, rank, a.mb);
          at::Tensor engine_loss = loss_of(model, expert, xe, ye, &engine);
          max_loss = std::max(max_loss, std::abs(engine_loss.item<double>() - loss.item<double>()));
          engine.backward(engine_loss);
          engine.step();
        }
      }
    }
    double sumsq = 0;
    for (const auto& g : grads) sumsq += g.square().sum().item<double>();
    const double norm = std::sqrt(sumsq);
    const double coef = a.clip > 0 && norm > a.clip ? a.clip / (norm + 1e-6) : 1.0;
    clipped += coef < 1.0;
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < ref_params.size(); ++i) ref_params[i].detach().add_(grads[i], -kLr * coef);
    const double rel = std::abs(engine.last_grad_norm() - norm) / norm;
    max_norm = std::max(max_norm, rel);
    if (rel > 1e-5)
      fail("step " + std::to_string(step) + " gradient norm " + std::to_string(engine.last_grad_norm()) +
           ", the reference's " + std::to_string(norm));
  }
  if (a.clip > 0 && clipped == 0) fail("no step was clipped: lower --clip");
  if (max_loss > 1e-5) fail("micro-batch losses differ from the reference's by " + std::to_string(max_loss));

  engine.wait_for_parameters();
  {
    auto whole = engine.gathered_parameters();
    const std::vector<std::pair<at::Tensor, at::Tensor>> pairs = {
        {model.w1, ref.w1}, {model.b1, ref.b1}, {model.expert_w[expert], ref.expert_w[expert]},
        {model.expert_b[expert], ref.expert_b[expert]}, {model.head, ref.head}};
    for (size_t i = 0; i < pairs.size(); ++i)
      if (!at::allclose(pairs[i].first.detach(), pairs[i].second.detach(), 1e-5, 1e-6))
        fail("parameter " + std::to_string(i) + " differs from the reference by " +
             std::to_string((pairs[i].first.detach() - pairs[i].second.detach()).abs().max().item<double>()));
  }

  // Each group's gradients travelled on its own communicator, whole buckets of its padded size
  // (with the default bucket one bucket a group, numels divisible by the group's ranks, so no
  // padding: exact; small buckets pad each one to a multiple of the ranks: within 20%): every
  // micro-step at stages 2-3, on the boundary at stages 0-1.
  const int64_t reductions = a.stage >= 2 ? int64_t(a.steps) * a.gas : a.steps;
  const int64_t dense = 16 * 12 + 16, experts = 16 * 16 + 16, head = 8 * 16;
  const std::vector<std::pair<Communicator*, int64_t>> expected = {
      {&ctx->data(), dense}, {&expert_data, experts}, {&head_comm, head}};
  std::string bytes;
  for (const auto& [comm, numel] : expected) {
    const int64_t got = reduced_bytes(*comm, a.stage), want = reductions * numel * 4;
    bytes += comm->name() + " " + std::to_string(got) + " B, ";
    const bool padded = a.bucket < 1000;
    if (padded ? got < want || got > want * 6 / 5 : got != want)
      fail(comm->name() + ": " + std::to_string(got) + " bytes of gradient reductions, expected " + std::to_string(want));
  }
  if (a.stage == 3) {  // the gathers on each group's second channel
    for (const char* spec : {"data", "expert_data", "expert_data*expert"}) {
      const auto& s = ctx->group_over(spec, "parameters").stats();
      if (s.find("all_gather") == s.end() || s.at("all_gather").bytes == 0) fail(std::string("no gathers over ") + spec);
    }
  }
  if (rank == 0)
    std::printf("groups ok: stage %d, %d of %d steps clipped, max |dloss| %.2g, max norm rel %.2g, reductions %s\n",
                a.stage, clipped, a.steps, max_loss, max_norm, bytes.c_str());
  return 0;
}

}  // namespace

static int main_body(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--stage") a.stage = std::stoi(v);
    else if (k == "--steps") a.steps = std::stoi(v);
    else if (k == "--gas") a.gas = std::stoi(v);
    else if (k == "--clip") a.clip = std::stod(v);
    else if (k == "--bucket") a.bucket = std::stoi(v);
    else {
      std::cerr << "unknown argument " << k << "\n";
      return 2;
    }
  }
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::cerr << "rank " << std::getenv("RANK") << ": " << e.what() << "\n";
    return 1;
  }
}

// Exits without LibTorch's static destructors (csrc/process_exit.h): main_body's objects are gone by then.
int main(int argc, char** argv) { tessera::exit_skipping_static_destructors(main_body(argc, argv)); }
