// What tests/workers/engine_worker.cpp (the reference comparisons) and tests/workers/engine_worker_memory.cpp (the
// --memory-sweep and --rss modes) share: the flags, the small MLP, its batches, config and units.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/mse_loss.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tanh.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace engine_worker {

using namespace tessera;

struct Args {
  int stage = 0, mb = 2, gas = 1, steps = 5, bucket = 1000000;
  int inject_inf_step = -1, throw_at_step = -1, drop_engine_step = -1;
  bool seed_by_rank = false, unused_off_rank0 = false, strict_unused = false, onecycle = false;
  std::string dtype = "fp32", optimizer = "adamw";
  double clip = 0;
  bool memory = false;
  int hidden = 0;
  bool memory_sweep = false;
  bool units = false;
  bool init = false;  // --init: built under PartitionedInit (zero.Init), layer by layer
  bool rss = false;
  bool allreduce = false;
  std::string comm_dtype;  // empty: the key is left out
  std::string grad_accum = "fp32";
  int layers = 0;
  // Stage 3: stage3_param_persistence_threshold, stage3_max_reuse_distance, stage3_prefetch_bucket_size.
  int64_t persist = 0, reuse = 0, prefetch = 800;
  // Optimizer offload: --offload cpu|nvme, --nvme-path DIR, --tile N (sub_group_size), --pipeline
  // (pipeline_read and pipeline_write), --buffers N (buffer_count).
  std::string offload = "none", nvme_path;
  std::string offload_param = "none", param_path;  // --offload-param cpu|nvme, --param-path DIR
  int param_buffers = 5;                          // --param-buffers N (offload_param.buffer_count)
  int64_t param_buffer_size = 100000000;          // --param-buffer-size N (offload_param.buffer_size)
  int64_t tile = 1000000000;
  bool pipeline = false;
  int buffers = 4;
  bool fill_nvme = false;  // --fill-nvme: after construction rank 0 fills the nvme_path's disk
  // --delayed N: offload_optimizer.delayed_param_update after N warm-up steps; the reference
  // delays its updates the same way (ZeRO-Offload's DPU).
  int delayed = -1, reference_delay = -1;
  bool super_offload = false;  // --super-offload: offload_optimizer.super_offload (the step speculated during backward)
  std::string dump;  // --dump FILE: rank 0 writes every step's loss and the final parameters' bytes
};

// A two-layer MLP with a bias-free third layer: parameters of several shapes and sizes. With
// `extra`, a sixth parameter (an output bias) that only some rows use: `extra_rows` masks them, and
// a model that is not given the mask does not touch the parameter at all (no gradient).
struct Mlp {
  std::vector<at::Tensor> params;
  explicit Mlp(uint64_t seed, int hidden = 0, bool extra = false) {
    build(seed, hidden);
    if (extra) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 7);
      params.push_back((at::randn({8}, gen, at::kFloat) * 0.3).set_requires_grad(true));
    }
  }
  void build(uint64_t seed, int hidden) {
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
  // `extra_rows`: [rows, 1] of 0/1 choosing the rows that add the extra bias (undefined: none do).
  // `throw_in_backward`: the gradient of the first layer's output throws (after the later layers'
  // parameters have their gradients).
  // `engine`: when given, each layer is a unit whose forward runs inside engine->unit(i).
  at::Tensor loss(const at::Tensor& x, const at::Tensor& y, const at::Tensor& extra_rows = {},
                  bool throw_in_backward = false, Engine* engine = nullptr) const {
    auto dtype = params[0].scalar_type();
    auto enter = [&](int unit) { return engine ? std::optional<UnitScope>(engine->unit(unit)) : std::nullopt; };
    auto leave = [](std::optional<UnitScope>& scope, at::Tensor t) { return scope ? scope->output(t) : t; };
    at::Tensor h, out;
    {
      auto scope = enter(0);
      h = leave(scope, at::tanh(at::linear(x.to(dtype), params[0], params[1])));
    }
    if (throw_in_backward)
      h.register_hook([](const at::Tensor&) -> at::Tensor { throw std::runtime_error("injected failure in backward"); });
    {
      auto scope = enter(1);
      h = leave(scope, at::tanh(at::linear(h, params[2], params[3])));
    }
    {
      auto scope = enter(2);
      out = at::linear(h, params[4]);
      if (extra_rows.defined()) out = out + params[5] * extra_rows.to(dtype);
      out = leave(scope, out);
    }
    return at::mse_loss(out.to(at::kFloat), y);
  }
};

// The global batch of one optimizer step: G = mb·gas·dp rows, the same on every rank.
std::pair<at::Tensor, at::Tensor> global_batch(int64_t rows, int step);
std::string config_text(const Args& a);
ModelDescription describe(Mlp& model, bool units = false);

int memory_sweep(Args a);
int peak_rss(const Args& a);

}  // namespace engine_worker
