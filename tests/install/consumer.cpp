// Trains y = 2x - 1 with tessera's Engine, from the installed headers and libraries only.
#include <ATen/ATen.h>
#include <torch/torch.h>

#include <cstdio>

#include "engine/config/config_io.h"
#include "engine/engine.h"
#include "parallel/parallel_context.h"

int main() {
  torch::manual_seed(0);
  auto ctx = tessera::ParallelContext::from_environment();
  tessera::Config config = tessera::load_config(
      R"({"train_micro_batch_size_per_gpu": 8, "steps_per_print": 100,
          "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_optimization": {"stage": 1}})",
      ctx->world_size());
  torch::nn::Linear model(1, 1);
  tessera::ModelDescription description;
  description.groups.push_back({{model->weight, model->bias}});
  tessera::Engine engine(config, *ctx, description);
  double first = 0, last = 0;
  for (int step = 0; step < 100; ++step) {
    at::Tensor x = torch::randn({8, 1});
    at::Tensor loss = torch::mse_loss(model(x), 2 * x - 1);
    if (step == 0) first = loss.item<double>();
    last = loss.item<double>();
    engine.backward(loss);
    engine.step();
  }
  std::printf("consumer: loss %.4f -> %.6f, weight %.4f, bias %.4f\n", first, last, model->weight.item<double>(),
              model->bias.item<double>());
  return last < 1e-3 * first ? 0 : 1;
}
