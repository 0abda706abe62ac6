// The program each rank runs in the engine tests: trains a small MLP through the Engine and, on
// every rank, the same model in a single process on the whole global batch with torch's own
// optimizer kernels (at::_fused_adamw_ / at::_fused_sgd_, what torch.optim runs with fused=True)
// or, for LAMB, a per-parameter reference written out here. Compares losses and parameters.
//
//   tessera_engine_worker --stage S --mb M --gas G --steps N [--dtype fp32|bf16|fp16]
//       [--optimizer adamw|adam|sgd|lamb] [--clip C] [--bucket B] [--inject-inf-step K] [--memory]
//       [--hidden H] [--memory-sweep]
//
// Prints "engine ok: max |dparam| X, max |dloss| Y" on rank 0 when within tolerance, else exits 1.
// --hidden H widens the MLP to 16 -> H -> H -> 8 (H·H + 26·H parameters; 0, the default, keeps
// the 1528-parameter one). --memory-sweep skips the reference: for ZeRO 0/1/2 × fp32/bf16 it builds
// an Engine over a fresh model, trains --steps steps and prints its memory on rank 0, one line each
// (tests/test_estimator.cpp compares them with the memory estimator).
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_sgd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/mse_loss.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/zeros.h>
#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/zeros_like.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "engine/config_io.h"
#include "engine/engine.h"
#include "parallel/parallel_context.h"

using namespace tessera;

namespace {

struct Args {
  int stage = 0, mb = 2, gas = 1, steps = 5, bucket = 1000000;
  int inject_inf_step = -1;
  std::string dtype = "fp32", optimizer = "adamw";
  double clip = 0;
  bool memory = false;
  int hidden = 0;
  bool memory_sweep = false;
};

// A two-layer MLP with a bias-free third layer: parameters of several shapes and sizes.
struct Mlp {
  std::vector<at::Tensor> params;
  explicit Mlp(uint64_t seed, int hidden = 0) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    auto make = [&](std::vector<int64_t> shape, double scale) {
      return (at::randn(shape, gen, at::kFloat) * scale).set_requires_grad(true);
    };
    if (hidden > 0) {
      const int64_t H = hidden;
      const double s = 1.0 / std::sqrt(static_cast<double>(H));
      params = {make({H, 16}, 0.25), make({H}, 0.1), make({H, H}, s), make({H}, 0.1), make({8, H}, s)};
      return;
    }
    params = {make({32, 16}, 0.25), make({32}, 0.1), make({24, 32}, 0.18), make({24}, 0.1), make({8, 24}, 0.2)};
  }
  at::Tensor loss(const at::Tensor& x, const at::Tensor& y) const {
    auto dtype = params[0].scalar_type();
    at::Tensor h = at::tanh(at::linear(x.to(dtype), params[0], params[1]));
    h = at::tanh(at::linear(h, params[2], params[3]));
    at::Tensor out = at::linear(h, params[4]);
    return at::mse_loss(out.to(at::kFloat), y);
  }
};

// The global batch of one optimizer step: G = mb·gas·dp rows, the same on every rank.
std::pair<at::Tensor, at::Tensor> global_batch(int64_t rows, int step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  at::Tensor x = at::randn({rows, 16}, gen, at::kFloat);
  at::Tensor y = at::randn({rows, 8}, gen, at::kFloat) * 0.5;
  return {x, y};
}

std::string config_text(const Args& a) {
  std::string opt;
  if (a.optimizer == "sgd")
    opt = R"({"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9, "nesterov": true, "weight_decay": 0.01}})";
  else if (a.optimizer == "lamb")
    opt = R"({"type": "Lamb", "params": {"lr": 0.02, "weight_decay": 0.01}})";
  else
    opt = std::string(R"({"type": ")") + (a.optimizer == "adam" ? "Adam" : "AdamW") +
          R"(", "params": {"lr": 0.01, "weight_decay": 0.1, "adam_w_mode": )" +
          (a.optimizer == "adam" ? "false" : "true") + "}}";
  char buf[1024];
  std::snprintf(buf, sizeof(buf),
                R"({"train_micro_batch_size_per_gpu": %d, "gradient_accumulation_steps": %d, "optimizer": %s,
                    "gradient_clipping": %g, "steps_per_print": 1000, "bf16": {"enabled": %s},
                    "fp16": {"enabled": %s, "initial_scale_power": 8, "hysteresis": 1},
                    "zero_optimization": {"stage": %d, "reduce_bucket_size": %d, "allgather_bucket_size": %d}})",
                a.mb, a.gas, opt.c_str(), a.clip, a.dtype == "bf16" ? "true" : "false",
                a.dtype == "fp16" ? "true" : "false", a.stage, a.bucket, a.bucket);
  return buf;
}

// The reference: one process, the whole global batch, torch's fused optimizers (or LAMB written out).
struct Reference {
  Mlp model;
  std::vector<at::Tensor> m, v, momentum, steps;
  Args a;
  explicit Reference(const Args& args) : model(42, args.hidden), a(args) {
    for (auto& p : model.params) {
      m.push_back(at::zeros_like(p));
      v.push_back(at::zeros_like(p));
      momentum.push_back(at::zeros_like(p));
      steps.push_back(at::zeros({}, at::kFloat));
    }
  }
  double step(const at::Tensor& x, const at::Tensor& y, bool skip) {
    for (auto& p : model.params) p.mutable_grad() = at::Tensor();
    at::Tensor loss = model.loss(x, y);
    loss.backward();
    if (skip) return loss.item<double>();
    std::vector<at::Tensor> params, grads;
    double sumsq = 0;
    for (auto& p : model.params) sumsq += std::pow(p.grad().norm().item<double>(), 2);
    const double norm = std::sqrt(sumsq);
    const double coef = (a.clip > 0 && norm > a.clip) ? a.clip / (norm + 1e-6) : 1.0;
    at::NoGradGuard no_grad;
    for (auto& p : model.params) {
      params.push_back(p.detach());
      grads.push_back(p.grad() * coef);
    }
    if (a.optimizer == "adamw" || a.optimizer == "adam") {
      for (auto& s : steps) s.add_(1);
      if (a.optimizer == "adamw")
        at::_fused_adamw_(params, grads, m, v, {}, steps, 0.01, 0.9, 0.999, 0.1, 1e-8, false, false);
      else
        at::_fused_adam_(params, grads, m, v, {}, steps, 0.01, 0.9, 0.999, 0.1, 1e-8, false, false);
    } else if (a.optimizer == "sgd") {
      at::_fused_sgd_(params, grads, momentum, 0.01, 0.9, 0.05, 0.0, true, false, first_sgd_step_);
      first_sgd_step_ = false;
    } else {  // LAMB, per parameter (You et al. 2020, as in DeepSpeed's FusedLamb)
      ++lamb_step_;
      const double bc1 = 1 - std::pow(0.9, lamb_step_), bc2 = 1 - std::pow(0.999, lamb_step_);
      for (size_t i = 0; i < params.size(); ++i) {
        m[i].mul_(0.9).add_(grads[i], 0.1);
        v[i].mul_(0.999).addcmul_(grads[i], grads[i], 0.001);
        at::Tensor u = (m[i] / bc1) / ((v[i] / bc2).sqrt() + 1e-8) + params[i] * 0.01;
        double w = params[i].norm().item<double>(), un = u.norm().item<double>();
        double trust = (w > 0 && un > 0) ? w / un : 1.0;
        trust = std::min(std::max(trust, 0.01), 10.0);
        params[i].add_(u, -0.02 * trust);
      }
    }
    return loss.item<double>();
  }
  bool first_sgd_step_ = true;
  int lamb_step_ = 0;
};

int run(const Args& a) {
  auto ctx = ParallelContext::from_environment(ParallelOptions{});
  const int dp = ctx->data().size(), rank = ctx->data().rank();
  Config config = load_config(config_text(a), ctx->world_size());
  Mlp model(42, a.hidden);
  ModelDescription description;
  description.groups.push_back({{model.params[0], model.params[2], model.params[4]}, std::nullopt, std::nullopt, "weights"});
  description.groups.push_back({{model.params[1], model.params[3]}, std::nullopt, std::nullopt, "biases"});
  Engine engine(config, *ctx, description);
  Reference reference(a);

  double max_loss_diff = 0;
  const int64_t rows = int64_t(a.mb) * a.gas * dp;
  for (int step = 0; step < a.steps; ++step) {
    auto [x, y] = global_batch(rows, step);
    double engine_loss = 0;
    for (int micro = 0; micro < a.gas; ++micro) {
      const int64_t begin = (int64_t(micro) * dp + rank) * a.mb;
      at::Tensor loss = model.loss(x.narrow(0, begin, a.mb), y.narrow(0, begin, a.mb));
      if (step == a.inject_inf_step && rank == dp - 1) loss = loss * std::numeric_limits<float>::infinity();
      engine_loss += loss.item<double>() / a.gas;
      engine.backward(loss);
      engine.step();
    }
    at::Tensor mean = at::full({1}, engine_loss, at::kDouble);
    ctx->data().all_reduce(mean, ReduceOp::Avg);
    const double ref_loss = reference.step(x, y, step == a.inject_inf_step);
    if (step != a.inject_inf_step) max_loss_diff = std::max(max_loss_diff, std::abs(mean.item<double>() - ref_loss));
  }

  double max_param_diff = 0;
  for (size_t i = 0; i < model.params.size(); ++i)
    max_param_diff = std::max(max_param_diff,
                              (model.params[i].detach().to(at::kFloat) - reference.model.params[i].detach())
                                  .abs().max().item<double>());
  // Every rank must hold the same parameters after the allgather.
  for (auto& p : model.params) {
    at::Tensor mine = p.detach().to(at::kFloat).contiguous(), top = mine.clone();
    ctx->data().broadcast(top, 0);
    if (!at::equal(mine, top)) throw std::runtime_error("parameters differ between data-parallel ranks");
  }
  const double tolerance = a.dtype == "fp32" ? 2e-5 : 3e-2;
  if (a.memory && rank == 0) {
    MemoryReport m = engine.memory();
    std::printf("memory: params %lld master %lld grads %lld states %lld buckets %lld\n", (long long)m.parameters,
                (long long)m.master_parameters, (long long)m.gradients, (long long)m.optimizer_states,
                (long long)m.buckets);
  }
  if (rank == 0) {
    std::printf("skipped steps %lld, global steps %lld, loss scale %g\n", (long long)engine.skipped_steps(),
                (long long)engine.global_step(), engine.loss_scale());
    if (max_param_diff > tolerance || max_loss_diff > tolerance) {
      std::printf("engine MISMATCH: max |dparam| %.3g, max |dloss| %.3g (tolerance %.1g)\n", max_param_diff,
                  max_loss_diff, tolerance);
      return 1;
    }
    std::printf("engine ok: max |dparam| %.3g, max |dloss| %.3g (tolerance %.1g)\n", max_param_diff, max_loss_diff,
                tolerance);
  }
  return 0;
}

// --memory-sweep: the engine's memory for each ZeRO stage and dtype, on a fresh model each.
int memory_sweep(Args a) {
  auto ctx = ParallelContext::from_environment(ParallelOptions{});
  const int dp = ctx->data().size(), rank = ctx->data().rank();
  for (int stage : {0, 1, 2}) {
    for (const char* dtype : {"fp32", "bf16"}) {
      a.stage = stage;
      a.dtype = dtype;
      Config config = load_config(config_text(a), ctx->world_size());
      Mlp model(42, a.hidden);
      ModelDescription description;
      description.groups.push_back({{model.params[0], model.params[2], model.params[4]}, std::nullopt, std::nullopt, "weights"});
      description.groups.push_back({{model.params[1], model.params[3]}, std::nullopt, std::nullopt, "biases"});
      Engine engine(config, *ctx, description);
      for (int step = 0; step < a.steps * a.gas; ++step) {
        auto [x, y] = global_batch(int64_t(a.mb) * dp, step);
        engine.backward(model.loss(x.narrow(0, int64_t(rank) * a.mb, a.mb), y.narrow(0, int64_t(rank) * a.mb, a.mb)));
        engine.step();
      }
      MemoryReport m = engine.memory();
      if (rank == 0)
        std::printf("memory stage %d dtype %s: params %lld master %lld grads %lld states %lld buckets %lld\n", stage,
                    dtype, (long long)m.parameters, (long long)m.master_parameters, (long long)m.gradients,
                    (long long)m.optimizer_states, (long long)m.buckets);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (k == "--stage") a.stage = std::stoi(next());
    else if (k == "--mb") a.mb = std::stoi(next());
    else if (k == "--gas") a.gas = std::stoi(next());
    else if (k == "--steps") a.steps = std::stoi(next());
    else if (k == "--bucket") a.bucket = std::stoi(next());
    else if (k == "--dtype") a.dtype = next();
    else if (k == "--optimizer") a.optimizer = next();
    else if (k == "--clip") a.clip = std::stod(next());
    else if (k == "--inject-inf-step") a.inject_inf_step = std::stoi(next());
    else if (k == "--memory") a.memory = true;
    else if (k == "--hidden") a.hidden = std::stoi(next());
    else if (k == "--memory-sweep") a.memory_sweep = true;
  }
  try {
    return a.memory_sweep ? memory_sweep(a) : run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "engine worker error: %s\n", e.what());
    return 1;
  }
}
