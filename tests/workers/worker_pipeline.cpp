#include "tests/workers/worker_pipeline.h"

#include <ATen/ops/full.h>
#include <ATen/ops/mse_loss.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tanh.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/parallel_context.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/simulator.h"

using namespace tessera;
using namespace tessera::pipeline;

namespace {

constexpr int kLayers = 8, kWidth = 16, kOut = 4, kRows = 4, kSteps = 3;
constexpr double kLr = 0.1;

at::Tensor draw(std::vector<int64_t> shape, uint64_t seed, double scale) {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, g, at::kFloat) * scale;
}

// Layer l: weight [out, in] and bias, from the seed; the last one narrows to kOut.
struct Layer {
  at::Tensor weight, bias;
};
std::vector<Layer> build_model() {
  std::vector<Layer> layers;
  for (int l = 0; l < kLayers; ++l) {
    const int64_t out = l == kLayers - 1 ? kOut : kWidth;
    layers.push_back({draw({out, kWidth}, 100 + l, 0.4).requires_grad_(), draw({out}, 200 + l, 0.1).requires_grad_()});
  }
  return layers;
}
at::Tensor apply(const Layer& layer, int l, const at::Tensor& x) {
  at::Tensor y = at::linear(x, layer.weight, layer.bias);
  return l == kLayers - 1 ? y : at::tanh(y);
}
// Step k's micro-batch mb: inputs and targets (different rows for every micro-batch and step).
at::Tensor inputs_of(int step, int mb) { return draw({kRows, kWidth}, 10000 + 100 * step + mb, 1.0); }
at::Tensor targets_of(int step, int mb) { return draw({kRows, kOut}, 20000 + 100 * step + mb, 1.0); }

void sgd(std::vector<Layer>& layers, int begin, int end) {
  at::NoGradGuard no_grad;
  for (int l = begin; l < end; ++l)
    for (at::Tensor* p : {&layers[l].weight, &layers[l].bias}) {
      p->sub_(p->grad() * kLr);
      p->mutable_grad().zero_();
    }
}

// This rank's part of the model as the executor sees it: its model chunks, each a range of layers
// (one chunk without interleaving); `first` / `last`: it holds the model's first / last chunk.
class MlpStage final : public PipelineStage {
 public:
  MlpStage(std::vector<Layer>& layers, std::vector<std::pair<int, int>> chunks, bool first, bool last, int micro_batches)
      : layers_(layers), chunks_(std::move(chunks)), first_(first), last_(last), m_(micro_batches) {}
  void set_step(int step) { step_ = step; }
  // By micro-batch: under zb_v stage 0 loads a micro-batch's targets long before its last chunk runs.
  void load(int mb) override {
    if (first_) input_[mb] = inputs_of(step_, mb);
    if (last_) target_[mb] = targets_of(step_, mb);
  }
  at::Tensor forward(int mb, const at::Tensor& input) override { return forward(mb, 0, input); }
  at::Tensor forward(int mb, int chunk, const at::Tensor& input) override {
    const int c = static_cast<int>(chunks_.size());
    const bool first = first_ && chunk == 0, last = last_ && chunk == c - 1;
    at::Tensor x = first ? input_.at(mb) : input;
    for (int l = chunks_[chunk].first; l < chunks_[chunk].second; ++l) x = apply(layers_[l], l, x);
    if (loss_on_first_ && first) return x.sum();  // the mistake the executor must name
    return last ? at::mse_loss(x, target_.at(mb)) / m_ : x;  // the batch's loss is the mean over micro-batches
  }
  bool loss_on_first_ = false;
  void step() override {
    for (const auto& [begin, end] : chunks_) sgd(layers_, begin, end);
  }

 private:
  std::vector<Layer>& layers_;
  std::vector<std::pair<int, int>> chunks_;
  bool first_, last_;
  int m_, step_ = 0;
  std::map<int, at::Tensor> input_, target_;
};

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  const double diff = (got - want).abs().max().item<double>();
  if (diff > 1e-6) throw std::runtime_error("check failed: " + what + " differs by " + std::to_string(diff));
}

}  // namespace

void check_pipeline(ParallelContext& ctx, const std::string& schedule_name, int m, bool dynamic_shape,
                    bool loss_on_first_stage, int v) {
  Communicator& pipe = ctx.pipe();
  const int p = pipe.size(), s = pipe.rank();
  std::vector<LayerInfo> infos(kLayers, LayerInfo{"Linear", kWidth * kWidth + kWidth});
  infos.back().parameters = kOut * kWidth + kOut;
  // p·v model chunks; stage s holds chunks s, s + p, ... (one chunk, s, without interleaving; zb_v:
  // s and 2p − 1 − s).
  const Placement placement = placement_of(schedule_name);
  const std::vector<int> bounds = partition_layers(infos, p * v, v > 1 ? "uniform" : "parameters");
  if (ctx.rank() == 0) std::printf("%s", describe_partition(infos, bounds, p, placement).c_str());
  const std::vector<std::pair<int, int>> mine = stage_layer_ranges(bounds, s, p, placement);

  // StageLink's receives posted ahead (p2p.h): stage 0 sends three tensors; stage 1 receives the
  // first (the stream's shape), posts the other two and gets them back in order; with dynamic
  // shapes nothing is posted (each tensor's header decides its buffer).
  if (p == 2) {
    StageLink link(pipe, dynamic_shape);
    if (s == 0) {
      for (int k = 0; k < 3; ++k) link.send(at::full({2, 3}, double(k)), 1, Stream::Activation);
      link.wait_sends();
    } else {
      at::Tensor first = link.recv(0, Stream::Activation);
      link.post_recv(0, Stream::Activation);
      link.post_recv(0, Stream::Activation);
      if (link.posted() != (dynamic_shape ? 0 : 2))
        throw std::runtime_error("check failed: " + std::to_string(link.posted()) + " receives posted ahead");
      for (int k = 0; k < 3; ++k) {
        const at::Tensor t = k == 0 ? first : link.recv(0, Stream::Activation);
        if (t.sizes() != at::IntArrayRef({2, 3}) || t.min().item<double>() != k || t.max().item<double>() != k)
          throw std::runtime_error("check failed: posted receive " + std::to_string(k) + " got another tensor");
      }
      if (link.posted() != 0) throw std::runtime_error("check failed: a posted receive left over");
    }
  }

  // The reference: the whole model in this process, micro-batches accumulated in order.
  std::vector<Layer> reference = build_model();
  std::vector<double> reference_losses;
  for (int step = 0; step < kSteps; ++step) {
    double loss = 0;
    for (int mb = 0; mb < m; ++mb) {
      at::Tensor x = inputs_of(step, mb);
      for (int l = 0; l < kLayers; ++l) x = apply(reference[l], l, x);
      at::Tensor l_mb = at::mse_loss(x, targets_of(step, mb)) / m;
      l_mb.backward();
      loss += l_mb.item<double>();
    }
    reference_losses.push_back(loss);
    sgd(reference, 0, kLayers);
  }

  // The pipeline: each stage holds every layer's initial values (same seed) but trains only its own.
  std::vector<Layer> model = build_model();
  PipelineExecutor executor(pipe, make_schedule(schedule_name, p, m, v), dynamic_shape);
  const ChunkLayout layout = executor.schedule().layout();
  MlpStage stage(model, mine, s == 0, s == layout.last_stage(), m);
  stage.loss_on_first_ = loss_on_first_stage;
  const Simulation simulated = simulate(executor.schedule());
  BatchReport report;
  for (int step = 0; step < kSteps; ++step) {
    stage.set_step(step);
    report = executor.run(stage);
    if (s == layout.last_stage()) {
      double loss = 0;
      for (double l : report.losses) loss += l;
      if (std::abs(loss - reference_losses[step]) > 1e-6)
        throw std::runtime_error("check failed: step " + std::to_string(step) + " loss " + std::to_string(loss) +
                                 ", single process " + std::to_string(reference_losses[step]));
    }
  }
  for (const auto& [begin, end] : mine)
    for (int l = begin; l < end; ++l) {
      expect_close(model[l].weight, reference[l].weight, "layer " + std::to_string(l) + " weight on stage " + std::to_string(s));
      expect_close(model[l].bias, reference[l].bias, "layer " + std::to_string(l) + " bias on stage " + std::to_string(s));
    }
  if (report.peak_activations != simulated.peak_activations[s])
    throw std::runtime_error("check failed: stage " + std::to_string(s) + " held " + std::to_string(report.peak_activations) +
                             " micro-batches, the simulator says " + std::to_string(simulated.peak_activations[s]));
  std::printf("stage %d: held %d micro-batches (simulated %d); idle %.3f measured, %.3f simulated with equal costs; "
              "%lld bytes sent\n",
              s, report.peak_activations, simulated.peak_activations[s], report.idle_fraction(), simulated.idle_fraction[s],
              (long long)executor.link().bytes_sent());
  std::printf("pipeline ok on rank %d\n", ctx.rank());
}
