#include "examples/models/cnn.h"
#include "examples/models/param_groups.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/conv2d.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/max_pool2d.h>
#include <ATen/ops/normal.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/zeros.h>

#include <cmath>
#include <stdexcept>

namespace tessera::examples {

namespace {
enum : int64_t { kConv1W, kConv1B, kConv2W, kConv2B, kFc1W, kFc1B, kFc2W, kFc2B };
}

int64_t Cnn::add(const std::string& name, at::Tensor value) {
  value.set_requires_grad(true);
  params_.push_back(std::move(value));
  names_.push_back(name);
  return static_cast<int64_t>(params_.size()) - 1;
}

Cnn::Cnn(CnnConfig config, uint64_t seed) : config_(config) {
  const CnnConfig& c = config_;
  if (c.channels1 < 1 || c.channels2 < 1 || c.hidden < 1 || c.classes < 1)
    throw std::invalid_argument("CnnConfig: every size must be >= 1");
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto he = [&](std::vector<int64_t> shape, int64_t fan_in, double gain) {
    return at::normal(0.0, std::sqrt(gain / static_cast<double>(fan_in)), shape, gen, at::kFloat);
  };
  auto zeros = [](int64_t n) { return at::zeros({n}, at::kFloat); };
  const int64_t flat = c.channels2 * 7 * 7;
  add("conv1.weight", he({c.channels1, 1, 3, 3}, 9, 2.0));
  add("conv1.bias", zeros(c.channels1));
  add("conv2.weight", he({c.channels2, c.channels1, 3, 3}, 9 * c.channels1, 2.0));
  add("conv2.bias", zeros(c.channels2));
  add("fc1.weight", he({c.hidden, flat}, flat, 2.0));
  add("fc1.bias", zeros(c.hidden));
  add("fc2.weight", at::normal(0.0, 0.01, {c.classes, c.hidden}, gen, at::kFloat));
  add("fc2.bias", zeros(c.classes));
}

int64_t Cnn::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.numel();
  return n;
}

at::Tensor Cnn::forward(const at::Tensor& images) {
  const std::vector<at::Tensor>& p = params_;  // read at every call: the engine may have replaced them
  if (images.dim() != 4 || images.size(1) != 1 || images.size(2) != 28 || images.size(3) != 28)
    throw std::invalid_argument("Cnn::forward: images must be [N, 1, 28, 28]");
  // Each layer inside its unit's scope when an engine listens (Engine::unit); its output handed over.
  auto layer = [&](int unit, auto&& body) {
    if (!engine_) return body();
    auto scope = engine_->unit(unit);
    return scope.output(body());
  };
  at::Tensor x = images.to(p[kConv1W].device(), p[kConv1W].scalar_type());
  x = layer(0, [&] { return at::max_pool2d(at::relu(at::conv2d(x, p[kConv1W], p[kConv1B], /*stride=*/1, /*padding=*/1)), 2); });
  x = layer(1, [&] { return at::max_pool2d(at::relu(at::conv2d(x, p[kConv2W], p[kConv2B], 1, 1)), 2); });
  x = layer(2, [&] { return at::relu(at::linear(x.flatten(1), p[kFc1W], p[kFc1B])); });
  return layer(3, [&] { return at::linear(x, p[kFc2W], p[kFc2B]); });
}

at::Tensor Cnn::loss(const at::Tensor& images, const at::Tensor& labels) {
  at::Tensor logits = forward(images);
  return at::cross_entropy_loss(logits.to(at::kFloat), labels.to(logits.device(), at::kLong));
}

int64_t Cnn::correct(const at::Tensor& logits, const at::Tensor& labels) {
  return logits.argmax(1).eq(labels.to(logits.device(), at::kLong)).sum().item<int64_t>();
}

ModelDescription Cnn::param_groups(double weight_decay) const {
  ModelDescription model = decay_groups(params_, weight_decay);
  const char* names[] = {"conv1", "conv2", "fc1", "fc2"};
  for (int64_t u = 0; u < 4; ++u) model.units.push_back({names[u], {params_[2 * u], params_[2 * u + 1]}});
  return model;
}

}  // namespace tessera::examples
