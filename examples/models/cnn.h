// A small CNN for Fashion-MNIST written with ATen ops, with the same shape of interface as the GPT
// (parameters(), forward, loss, param_groups):
//
//   conv 3×3, 1 → 32, pad 1, ReLU, max-pool 2    [N, 32, 14, 14]
//   conv 3×3, 32 → 64, pad 1, ReLU, max-pool 2   [N, 64, 7, 7]
//   linear 3136 → 128, ReLU
//   linear 128 → 10                              logits
//
// As for the GPT, parameters are read from `parameters()` at every forward (the engine may re-point
// or replace them), activations follow the parameters' dtype and device, the loss is fp32. Its
// units are conv1, conv2, fc1 and fc2; once attach()ed, the forward reports them to the engine
// (ZeRO-3 gathers each layer's parameters only while it runs).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"  // ModelDescription

namespace tessera::examples {

struct CnnConfig {
  int64_t channels1 = 32;
  int64_t channels2 = 64;
  int64_t hidden = 128;
  int64_t classes = 10;
};

class Cnn {
 public:
  // Deterministic initialization from `seed`: He (Kaiming normal, fan-in) for the layers followed
  // by a ReLU, N(0, 0.01) for the output layer (the initial loss is then close to ln 10); biases 0.
  Cnn(CnnConfig config, uint64_t seed);

  const CnnConfig& config() const { return config_; }
  std::vector<at::Tensor>& parameters() { return params_; }
  const std::vector<at::Tensor>& parameters() const { return params_; }
  // "conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight", ..., "fc2.bias"
  std::vector<std::string> parameter_names() const { return names_; }
  int64_t num_parameters() const;

  // images: float [N, 1, 28, 28]. Returns logits [N, classes] in the parameters' dtype.
  at::Tensor forward(const at::Tensor& images);
  // Mean cross-entropy, fp32 scalar.
  at::Tensor loss(const at::Tensor& images, const at::Tensor& labels);
  // Number of correct argmax predictions (no autograd needed).
  static int64_t correct(const at::Tensor& logits, const at::Tensor& labels);

  // "decay": the conv and linear weights (dim >= 2) with `weight_decay`; "no_decay": biases, 0;
  // and the units, one per layer.
  ModelDescription param_groups(double weight_decay) const;
  // The forward enters each unit's scope of this engine (nullptr: none).
  void attach(Engine* engine) { engine_ = engine; }

 private:
  int64_t add(const std::string& name, at::Tensor value);

  CnnConfig config_;
  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  Engine* engine_ = nullptr;
};

}  // namespace tessera::examples
