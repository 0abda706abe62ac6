// The engine worker's memory modes (tests/workers/engine_worker.cpp has the flags): --memory-sweep prints
// the engine's buffers per ZeRO stage and dtype (tests/engine/estimator/test_estimator.cpp compares them with the
// estimator), --rss every rank's peak resident set after training (tests/zero/test_memory.cpp).
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>

#include <cstdio>

#include "engine/config/config_io.h"
#include "csrc/cpu_block_cache.h"
#include "engine/progress.h"  // peak_rss_bytes
#include "parallel/parallel_context.h"
#include "tests/workers/engine_worker.h"

namespace engine_worker {

// --memory-sweep: the engine's memory for each ZeRO stage and dtype, on a fresh model each (stage 3
// with every parameter partitioned: --persist 0).
int memory_sweep(Args a) {
  auto ctx = ParallelContext::from_environment(ParallelOptions{});
  const int dp = ctx->data().size(), rank = ctx->data().rank();
  for (int stage : {0, 1, 2, 3}) {
    if (stage == 0 && a.offload != "none") continue;  // optimizer offload needs a partitioned optimizer
    if (stage < 3 && a.offload_param != "none") continue;  // parameter offload needs partitioned parameters
    for (const char* dtype : {"fp32", "bf16"}) {
      a.stage = stage;
      a.dtype = dtype;
      Config config = load_config(config_text(a), ctx->world_size());
      Mlp model(42, a.hidden);
      Engine engine(config, *ctx, describe(model));
      for (int step = 0; step < a.steps * a.gas; ++step) {
        auto [x, y] = global_batch(int64_t(a.mb) * dp, step);
        engine.backward(model.loss(x.narrow(0, int64_t(rank) * a.mb, a.mb), y.narrow(0, int64_t(rank) * a.mb, a.mb)));
        engine.step();
      }
      MemoryReport m = engine.memory();
      if (rank == 0)
        std::printf("memory stage %d dtype %s: params %lld master %lld grads %lld states %lld buckets %lld "
                    "offloaded %lld offloaded_params %lld host %lld host_params %lld\n", stage, dtype,
                    (long long)m.parameters, (long long)m.master_parameters, (long long)m.gradients,
                    (long long)m.optimizer_states, (long long)m.buckets, (long long)m.offloaded_optimizer_bytes,
                    (long long)m.offloaded_parameter_bytes, (long long)m.host_optimizer_bytes,
                    (long long)m.host_parameter_bytes);
    }
  }
  return 0;
}

// A deep MLP for --rss: 16 -> H, `layers` × (H -> H, tanh), H -> 8; many parameters of moderate
// size, as a transformer has (no single one dominates the buckets or autograd's transients).
struct DeepMlp {
  std::vector<at::Tensor> params;
  DeepMlp(int hidden, int layers) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(42);
    auto make = [&](std::vector<int64_t> shape, double scale) {
      return (at::randn(shape, gen, at::kFloat) * scale).set_requires_grad(true);
    };
    const double s = 1.0 / std::sqrt(static_cast<double>(hidden));
    params = {make({hidden, 16}, 0.25), make({hidden}, 0.1)};
    for (int l = 0; l < layers; ++l) {
      params.push_back(make({hidden, hidden}, s));
      params.push_back(make({hidden}, 0.1));
    }
    params.push_back(make({8, hidden}, s));
  }
  at::Tensor loss(const at::Tensor& x, const at::Tensor& y) const {
    const auto dtype = params[0].scalar_type();
    at::Tensor h = x.to(dtype);
    for (size_t i = 0; i + 1 < params.size(); i += 2) h = at::tanh(at::linear(h, params[i], params[i + 1]));
    return at::mse_loss(at::linear(h, params.back()).to(at::kFloat), y);
  }
  ModelDescription describe() {
    ModelDescription d;
    ParamGroup weights, biases;
    weights.name = "weights";
    biases.name = "biases";
    for (const auto& p : params) (p.dim() >= 2 ? weights : biases).params.push_back(p);
    d.groups = {weights, biases};
    return d;
  }
};

// --rss: the process's peak memory after training (no reference model: only the engine's buffers,
// the model's activations and the runtime). With --layers L the model is DeepMlp(--hidden, L).
int peak_rss(const Args& a) {
  // As a training program does before it builds its model (the engine would install it anyway):
  // the model's tensors then leave no freed heap behind to count in the peak.
  tessera::CpuBlockCache::install_from_environment();
  auto ctx = ParallelContext::from_environment(ParallelOptions{});
  const int dp = ctx->data().size(), rank = ctx->data().rank();
  Config config = load_config(config_text(a), ctx->world_size());
  std::optional<Mlp> mlp;
  std::optional<DeepMlp> deep;
  if (a.layers > 0) deep.emplace(a.hidden, a.layers);
  else mlp.emplace(42, a.hidden);
  // Where the peak happens: the high-water mark after each phase of the first steps (rank 0).
  std::string phases;
  auto mark = [&](const char* what) {
    phases += std::string(" ") + what + " " + std::to_string(peak_rss_bytes() >> 20);
  };
  mark("start");
  Engine engine(config, *ctx, deep ? deep->describe() : describe(*mlp));
  mark("built");
  for (int step = 0; step < a.steps * a.gas; ++step) {
    auto [x, y] = global_batch(int64_t(a.mb) * dp, step);
    at::Tensor xs = x.narrow(0, int64_t(rank) * a.mb, a.mb), ys = y.narrow(0, int64_t(rank) * a.mb, a.mb);
    engine.backward(deep ? deep->loss(xs, ys) : mlp->loss(xs, ys));
    if (step < 2) mark("backward");
    engine.step();
    if (step < 2) mark("step");
  }
  std::printf("rank %d peak rss by phase (MiB):%s\n", rank, phases.c_str());
  const MemoryReport m = engine.memory();
  at::Tensor rss = at::full({1}, peak_rss_bytes(), at::kLong);
  at::Tensor all = at::empty({dp}, at::kLong);
  ctx->data().all_gather(rss, all);
  if (rank == 0) {
    std::printf("peak rss stage %d dtype %s:", a.stage, a.dtype.c_str());
    for (int r = 0; r < dp; ++r) std::printf(" %lld", (long long)all[r].item<int64_t>());
    std::printf("\nmemory stage %d dtype %s: params %lld master %lld grads %lld states %lld buckets %lld\n", a.stage,
                a.dtype.c_str(), (long long)m.parameters, (long long)m.master_parameters, (long long)m.gradients,
                (long long)m.optimizer_states, (long long)m.buckets);
  }
  return 0;
}

}  // namespace engine_worker
