// train_cnn: a small CNN (examples/models/cnn.h) on Fashion-MNIST, trained by the tessera Engine
// with whatever the DeepSpeed-style config asks for.
//
//   tessera launch --nproc-per-node 2 -- train_cnn --config configs/zero1_fp32.json --steps 300
//
// Flags: --config FILE (required), --steps N optimizer steps (required), --seed S (1234),
//        --eval-every K (0: never) loss and accuracy on the 10,000 test images every K steps
//        (each data-parallel rank evaluates its share).
//
// Every rank builds the model from the same seed and draws the same GLOBAL batch for each
// optimizer step, train_batch_size = micro_batch × gradient_accumulation_steps × data-parallel size
// images; micro-step m uses its rows [m·dp·micro, (m+1)·dp·micro), of which this rank trains on
// its own `micro`. So the data, and in exact arithmetic the whole run, depend only on
// train_batch_size, not on how it is split over ranks and accumulation steps. At the end rank 0
// prints `final loss: <value>`: the last optimizer step's loss (mean over its micro-steps),
// averaged over the data-parallel ranks.
#include <ATen/core/grad_mode.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "csrc/process_exit.h"
#include "engine/config/config_io.h"
#include "engine/engine.h"
#include "examples/data/fashion_mnist.h"
#include "examples/models/cnn.h"
#include "examples/train_args.h"
#include "parallel/parallel_context.h"

using namespace tessera;
using namespace tessera::examples;

namespace {

constexpr int64_t kEvalChunk = 500;  // test images per forward (bounds the activations)

const char* kUsage = "usage: train_cnn --config FILE --steps N [--seed S] [--eval-every K] [--save-parameters FILE]";

struct TestResult {
  double loss = 0, accuracy = 0;
};

// The whole test set, split over the data-parallel ranks.
TestResult evaluate(Cnn& model, const FashionMnist& data, ParallelContext& ctx) {
  at::NoGradGuard no_grad;
  const int64_t n = data.size(FashionMnist::Split::Test);
  const ChunkRange mine = chunk_range(n, ctx.data().size(), ctx.coordinates().data);
  double loss_sum = 0, correct = 0;
  for (int64_t begin = mine.begin; begin < mine.end; begin += kEvalChunk) {
    const int64_t count = std::min(kEvalChunk, mine.end - begin);
    ImageBatch b = data.range(begin, count, FashionMnist::Split::Test);
    at::Tensor logits = model.forward(b.images);
    loss_sum += at::cross_entropy_loss(logits.to(at::kFloat), b.labels).item<double>() * static_cast<double>(count);
    correct += static_cast<double>(Cnn::correct(logits, b.labels));
  }
  at::Tensor totals = at::tensor(std::vector<double>{loss_sum, correct}, at::kDouble);
  ctx.data().all_reduce(totals, ReduceOp::Sum);
  return {totals[0].item<double>() / static_cast<double>(n), totals[1].item<double>() / static_cast<double>(n)};
}

int run(int argc, char** argv) {
  const TrainArgs args = parse_train_args(argc, argv, kUsage);
  if (args.gpt_only_flags())
    throw std::invalid_argument("train_cnn: --checkpoint-activations, --n-layer, --n-head, --n-embd and --timeline are for train_gpt");

  // The world size comes from the environment before any connection: the config needs it to
  // resolve the parallel degrees and the batch triple.
  const RendezvousInfo info = rendezvous_info_from_environment();
  ResolvedLayout layout;
  std::vector<std::string> warnings;
  Config config = load_config(args.config, info.world_size, &layout, &warnings);
  ParallelOptions options;
  options.tensor = layout.tensor;
  options.pipe = layout.pipe;
  auto ctx = ParallelContext::from_environment(options);
  const bool leader = ctx->rank() == 0;
  if (leader)
    for (const auto& w : warnings) std::fprintf(stderr, "train_cnn: warning: %s\n", w.c_str());

  const int64_t micro = config.train_micro_batch_size_per_gpu.value_or(1);
  const int64_t accumulation = config.gradient_accumulation_steps.value_or(1);
  const int64_t dp = ctx->data().size();
  const int64_t rank = ctx->coordinates().data;  // this rank's place on the data-parallel axis
  const double weight_decay = config.optimizer ? config.optimizer->params.weight_decay : 0.0;

  FashionMnist data;
  Cnn model(CnnConfig{}, args.seed);
  if (leader) {
    std::printf("train_cnn: %s\n", ctx->describe().c_str());
    std::printf("train_cnn: CNN %lld parameters; Fashion-MNIST %lld train, %lld test images\n",
                (long long)model.num_parameters(), (long long)data.size(FashionMnist::Split::Train),
                (long long)data.size(FashionMnist::Split::Test));
    std::printf("train_cnn: %lld steps of %lld images (%lld per rank x %lld micro-steps x %lld data-parallel ranks)\n",
                (long long)args.steps, (long long)(micro * accumulation * dp), (long long)micro,
                (long long)accumulation, (long long)dp);
    std::fflush(stdout);
  }

  Engine engine(config, *ctx, model.param_groups(weight_decay));
  model.attach(&engine);  // the forward reports its units (one per layer) to the engine

  double last_loss = 0;
  for (int64_t step = 0; step < args.steps; ++step) {
    double step_loss = 0;
    // The step's global batch; micro-step m is its rows [m·dp·micro, (m+1)·dp·micro), and this
    // rank takes its `micro` rows of those.
    const ImageBatch global = data.sample(micro * dp * accumulation, step, args.seed);
    for (int64_t m = 0; m < accumulation; ++m) {
      const ImageBatch mine = rows(global, (m * dp + rank) * micro, micro);
      at::Tensor loss = model.loss(mine.images, mine.labels);
      engine.record_batch(micro);
      engine.backward(loss);
      engine.step();
      step_loss += loss.item<double>();
    }
    last_loss = step_loss / static_cast<double>(accumulation);

    if (args.eval_every > 0 && ((step + 1) % args.eval_every == 0 || step + 1 == args.steps)) {
      const double train = data_parallel_mean(*ctx, last_loss);
      const TestResult test = evaluate(model, data, *ctx);
      if (leader) {
        std::printf("step %lld: train loss %.4f, test loss %.4f, test accuracy %.2f%%\n", (long long)(step + 1), train,
                    test.loss, 100.0 * test.accuracy);
        std::fflush(stdout);
      }
    }
  }

  const double final_loss = data_parallel_mean(*ctx, last_loss);
  if (leader) std::printf("final loss: %.6f\n", final_loss);
  if (!args.save_parameters.empty()) {
    auto whole = engine.gathered_parameters();  // ZeRO-3's partitions made whole
    if (leader) write_parameters(args.save_parameters, model.parameters());
  }
  return 0;
}

}  // namespace

static int main_body(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_cnn: %s\n", e.what());
    return 1;
  }
}

// Exits without LibTorch's static destructors (csrc/process_exit.h): main_body's objects are gone by then.
int main(int argc, char** argv) { tessera::exit_skipping_static_destructors(main_body(argc, argv)); }
