// The program each rank runs in the engine tests: trains a small MLP through the Engine and, on
// every rank, the same model in a single process on the whole global batch with torch's own
// optimizer kernels (at::_fused_adamw_ / at::_fused_sgd_, what torch.optim runs with fused=True)
// or, for LAMB, a per-parameter reference written out here. Compares losses and parameters.
//
//   tessera_engine_worker --stage S --mb M --gas G --steps N [--dtype fp32|bf16|fp16] [--then <another case>...]
//       [--optimizer adamw|adam|sgd|sgd-plain|lamb] [--clip C] [--bucket B] [--inject-inf-step K]
//       [--memory] [--hidden H] [--memory-sweep] [--seed-by-rank] [--unused-off-rank0]
//       [--throw-at-step K] [--onecycle] [--drop-engine-step K] [--strict-unused]
//
// Prints "engine ok: max |dparam| X, max |dloss| Y, max |dnorm| Z" on rank 0 when within tolerance,
// else exits 1. Tolerances: fp32 2e-5 absolute for parameters and losses and 1e-4 relative for the
// gradient norm; bf16/fp16 mean parameter difference within 10% of the reference's mean total
// update (so a dropped or doubled step fails), losses within 3e-2, norms within 5%.
//
// Fault and corner cases, each compared with the same reference:
//   --seed-by-rank       rank r builds its model from seed 42 + r: the engine must broadcast rank 0's.
//   --unused-off-rank0   an extra bias is used on rank 0 only: other ranks produce no gradient for it.
//   --strict-unused      with it, zero_optimization.ignore_unused_parameters is false (expect an error).
//   --throw-at-step K    on step K, backward throws on every rank after some buckets were launched;
//                        the engine discards that window and the reference skips batch K.
//   --onecycle           OneCycle schedule with cycle_momentum (SGD's momentum must not cycle).
//   --drop-engine-step K the engine skips batch K while the reference trains on it (must MISMATCH).
//   --allreduce          zero_optimization.reduce_scatter false: stages 1-2 allreduce their buckets.
//   --comm-dtype D       communication_data_type D (fp32, bf16, fp16): gradients reduced in D; with
//                        bf16/fp16 the low-precision tolerances apply.
//   --grad-accum D       data_types.grad_accum_dtype D (fp32, bf16; bf16 with --dtype bf16, stages 0-1).
//   --persist N, --reuse N, --prefetch N   ZeRO-3's stage3_param_persistence_threshold (default 0:
//                        every parameter partitioned), stage3_max_reuse_distance (0) and
//                        stage3_prefetch_bucket_size (800: about one unit of the MLP). With --units at stage 3 the worker checks
//                        that nothing stays gathered after a step and that the most gathered at
//                        once is below the whole model.
//   --offload cpu|nvme   offload_optimizer.device, with --nvme-path DIR, --tile N (sub_group_size),
//                        --buffers N (buffer_count) and --pipeline (pipeline_read and _write).
//   --offload-param cpu|nvme   offload_param.device (stage 3), with --param-path DIR and
//                        --param-buffers N (buffer_count), --param-buffer-size N (buffer_size).
//   --super-offload      offload_optimizer.super_offload (with --offload cpu and TESSERA_HOST_STAGING=1):
//                        prints "speculated steps: kept K restored R, chunks stepped during backward C".
//   --delayed N          offload_optimizer.delayed_param_update after N warm-up steps (with --offload
//                        cpu and TESSERA_HOST_STAGING=1); the reference delays its updates the same
//                        way, unless --reference-delay M gives it another warm-up (-1: none; expect
//                        a MISMATCH).
//   --fill-nvme          after construction rank 0 fills the disk under --nvme-path (or --param-path; the first
//                        step's write must then fail naming its file).
//   --dump FILE          rank 0 writes every step's mean loss (double) and the final parameters'
//                        bytes to FILE, for byte-for-byte comparisons between runs.
//   --init               each layer is partitioned as soon as it is built (zero/partitioned_init.h):
//                        the engine builds its buffers from the chunks; no rank holds the model.
//   --units              the model is three units (layer1, layer2, head) and enters each one's scope
//                        (Engine::unit) in its forward; the last micro-step's unit events must be
//                        forward 0, 1, 2 then backward 2, 1, 0, each unit's counts one per micro-step.
//                        With overlap_comm on: at stages 1-2 on 2+ ranks the parameter allgather is
//                        left to the next forward's units (checked after every step), and the
//                        results still match the reference.
// --hidden H widens the MLP to 16 -> H -> H -> 8 (H·H + 26·H parameters; 0, the default, keeps
// the 1528-parameter one). --memory-sweep skips the reference: for ZeRO 0/1/2/3 × fp32/bf16 it builds
// an Engine over a fresh model, trains --steps steps and prints its memory on rank 0, one line each
// (tests/engine/estimator/test_estimator.cpp compares them with the memory estimator). --rss skips the reference
// too: it trains --steps steps at the given stage and dtype and prints every rank's peak resident
// set size and the engine's memory report (tests/zero/test_memory.cpp compares the peaks across stages,
// one process per stage). Both memory modes are in tests/workers/engine_worker_memory.cpp.
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
#include <optional>
#include <string>
#include <vector>

#include "csrc/process_exit.h"
#include "engine/config/config_io.h"
#include "engine/engine.h"
#include "engine/progress.h"  // peak_rss_bytes
#include "optim/lr_schedule.h"
#include "parallel/parallel_context.h"
#include "tests/workers/engine_worker.h"
#include "zero/partitioned_init.h"

using namespace tessera;
using namespace engine_worker;

// ---- shared with the memory modes (tests/workers/engine_worker.h) ---------------------------------------

std::pair<at::Tensor, at::Tensor> engine_worker::global_batch(int64_t rows, int step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  at::Tensor x = at::randn({rows, 16}, gen, at::kFloat);
  at::Tensor y = at::randn({rows, 8}, gen, at::kFloat) * 0.5;
  return {x, y};
}

std::string engine_worker::config_text(const Args& a) {
  std::string opt;
  if (a.optimizer == "sgd")
    opt = R"({"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9, "nesterov": true, "weight_decay": 0.01}})";
  else if (a.optimizer == "sgd-plain")  // no momentum, no decay: the update is -lr·g, a wrong scale shows
    opt = R"({"type": "SGD", "params": {"lr": 0.5, "momentum": 0.0, "weight_decay": 0.0}})";
  else if (a.optimizer == "lamb")
    opt = R"({"type": "Lamb", "params": {"lr": 0.02, "weight_decay": 0.01}})";
  else
    opt = std::string(R"({"type": ")") + (a.optimizer == "adam" ? "Adam" : "AdamW") +
          R"(", "params": {"lr": 0.01, "weight_decay": 0.1, "adam_w_mode": )" +
          (a.optimizer == "adam" ? "false" : "true") + "}}";
  // OneCycle over 4 steps: lr 0.01 -> 0.05 -> 0.01, momentum 0.99 -> 0.8 -> 0.99 (if it cycled).
  const char* scheduler = a.onecycle ? R"(, "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.01,
      "cycle_max_lr": 0.05, "cycle_first_step_size": 2, "cycle_momentum": true, "cycle_min_mom": 0.8,
      "cycle_max_mom": 0.99}})" : "";
  std::string offload;
  if (a.offload != "none") {
    offload = ", \"sub_group_size\": " + std::to_string(a.tile) + ", \"offload_optimizer\": {\"device\": \"" +
              a.offload + "\", \"nvme_path\": \"" + a.nvme_path + "\", \"buffer_count\": " +
              std::to_string(a.buffers) + ", \"pipeline_read\": " + (a.pipeline ? "true" : "false") +
              ", \"pipeline_write\": " + (a.pipeline ? "true" : "false") +
              (a.delayed >= 0 ? ", \"delayed_param_update\": {\"enabled\": true, \"warmup_steps\": " +
                                    std::to_string(a.delayed) + "}"
                              : std::string()) +
              (a.super_offload ? ", \"super_offload\": true" : "") + "}";
  }
  if (a.offload_param != "none")
    offload += ", \"offload_param\": {\"device\": \"" + a.offload_param + "\", \"nvme_path\": \"" + a.param_path +
               "\", \"buffer_count\": " + std::to_string(a.param_buffers) +
               ", \"buffer_size\": " + std::to_string(a.param_buffer_size) + "}";
  char buf[4096];
  std::snprintf(buf, sizeof(buf),
                R"({"train_micro_batch_size_per_gpu": %d, "gradient_accumulation_steps": %d, "optimizer": %s,
                    %s"data_types": {"grad_accum_dtype": "%s"},
                    "gradient_clipping": %g, "steps_per_print": 1000, "bf16": {"enabled": %s},
                    "fp16": {"enabled": %s, "initial_scale_power": 8, "hysteresis": 1},
                    "zero_optimization": {"stage": %d, "reduce_bucket_size": %d, "allgather_bucket_size": %d,
                                          "ignore_unused_parameters": %s, "overlap_comm": %s,
                                          "reduce_scatter": %s, "stage3_param_persistence_threshold": %lld,
                                          "stage3_max_reuse_distance": %lld, "stage3_prefetch_bucket_size": %lld%s}%s})",
                a.mb, a.gas, opt.c_str(),
                a.comm_dtype.empty() ? "" : ("\"communication_data_type\": \"" + a.comm_dtype + "\", ").c_str(),
                a.grad_accum.c_str(), a.clip, a.dtype == "bf16" ? "true" : "false",
                a.dtype == "fp16" ? "true" : "false", a.stage, a.bucket, a.bucket,
                a.strict_unused ? "false" : "true", a.units ? "true" : "false", a.allreduce ? "false" : "true",
                (long long)a.persist, (long long)a.reuse, (long long)a.prefetch, offload.c_str(), scheduler);
  return buf;
}

ModelDescription engine_worker::describe(Mlp& model, bool units) {
  ModelDescription d;
  if (units) {
    d.units = {{"layer1", {model.params[0], model.params[1]}}, {"layer2", {model.params[2], model.params[3]}},
               {"head", {model.params[4]}}};
    if (model.params.size() > 5) d.units[2].params.push_back(model.params[5]);
    d.enters_units = true;  // the MLP's forward enters each unit (ZeRO-3 then starts released)
  }
  ParamGroup weights;
  weights.params = {model.params[0], model.params[2], model.params[4]};
  weights.name = "weights";
  weights.param_names = {"layer1.weight", "layer2.weight", "layer3.weight"};
  d.groups.push_back(weights);
  std::vector<at::Tensor> biases = {model.params[1], model.params[3]};
  std::vector<std::string> names = {"layer1.bias", "layer2.bias"};
  if (model.params.size() > 5) {
    biases.push_back(model.params[5]);
    names.push_back("extra.bias");
  }
  ParamGroup bias_group;
  bias_group.params = biases;
  bias_group.name = "biases";
  bias_group.param_names = names;
  d.groups.push_back(bias_group);
  return d;
}

namespace {

// The rows of a global batch of `rows` that belong to data-parallel rank 0 (row i is in micro-step
// i / (mb·dp), on rank (i / mb) mod dp): they alone use the extra bias with --unused-off-rank0.
at::Tensor rank0_rows(int64_t rows, int mb, int dp) {
  at::Tensor mask = at::zeros({rows, 1}, at::kFloat);
  for (int64_t i = 0; i < rows; ++i)
    if ((i / mb) % dp == 0) mask.narrow(0, i, 1).fill_(1.0);
  return mask;
}

// The reference: one process, the whole global batch, torch's fused optimizers (or SGD and LAMB
// written out). Remembers the gradient norm of every step, before clipping.
// With --delayed N the optimizer steps `master`, a copy: the model takes the master's values
// after each of the first N applied steps, and from then on just before each step, so its next
// forward and backward run one update behind (ZeRO-Offload §5); flush() hands over the last update.
// Without it `master` is the model's own tensors.
struct Reference {
  Mlp model;
  std::vector<at::Tensor> m, v, momentum, steps, initial, master;
  Args a;
  double last_norm = 0;
  int64_t applied_steps = 0;
  explicit Reference(const Args& args) : model(42, args.hidden, args.unused_off_rank0), a(args) {
    for (auto& p : model.params) {
      master.push_back(a.reference_delay >= 0 ? p.detach().clone() : p.detach());
      m.push_back(at::zeros_like(p));
      v.push_back(at::zeros_like(p));
      momentum.push_back(at::zeros_like(p));
      steps.push_back(at::zeros({}, at::kFloat));
      initial.push_back(p.detach().clone());
    }
  }
  // The mean distance the parameters travelled from their initial values.
  double mean_update() const {
    double sum = 0;
    int64_t n = 0;
    for (size_t i = 0; i < initial.size(); ++i) {
      sum += (model.params[i].detach() - initial[i]).abs().sum().item<double>();
      n += initial[i].numel();
    }
    return sum / double(n);
  }
  double step(const at::Tensor& x, const at::Tensor& y, bool skip, double lr_now, const at::Tensor& extra_rows) {
    for (auto& p : model.params) p.mutable_grad() = at::Tensor();
    at::Tensor loss = model.loss(x, y, extra_rows);
    loss.backward();
    if (skip) return loss.item<double>();
    std::vector<at::Tensor> params, grads;
    double sumsq = 0;
    for (auto& p : model.params) sumsq += std::pow(p.grad().norm().item<double>(), 2);
    const double norm = std::sqrt(sumsq);
    last_norm = norm;
    const double coef = (a.clip > 0 && norm > a.clip) ? a.clip / (norm + 1e-6) : 1.0;
    at::NoGradGuard no_grad;
    const bool delayed = a.reference_delay >= 0 && ++applied_steps > a.reference_delay;
    for (size_t i = 0; i < model.params.size(); ++i) {
      if (delayed) model.params[i].detach().copy_(master[i]);  // the update before this one, now
      params.push_back(master[i]);
      grads.push_back(model.params[i].grad() * coef);
    }
    if (a.optimizer == "adamw" || a.optimizer == "adam") {
      for (auto& s : steps) s.add_(1);
      if (a.optimizer == "adamw")
        at::_fused_adamw_(params, grads, m, v, {}, steps, lr_now, 0.9, 0.999, 0.1, 1e-8, false, false);
      else
        at::_fused_adam_(params, grads, m, v, {}, steps, lr_now, 0.9, 0.999, 0.1, 1e-8, false, false);
    } else if (a.optimizer == "sgd") {
      // Momentum stays 0.9 under OneCycle too: SGD has no betas to cycle (DeepSpeed's rule).
      at::_fused_sgd_(params, grads, momentum, 0.01, 0.9, lr_now, 0.0, true, false, first_sgd_step_);
      first_sgd_step_ = false;
    } else if (a.optimizer == "sgd-plain") {
      for (size_t i = 0; i < params.size(); ++i) params[i].add_(grads[i], -lr_now);
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
        params[i].add_(u, -lr_now * trust);
      }
    }
    if (a.reference_delay >= 0 && !delayed) flush();
    return loss.item<double>();
  }
  void flush() {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < model.params.size(); ++i) model.params[i].detach().copy_(master[i]);
  }
  bool first_sgd_step_ = true;
  int lamb_step_ = 0;
};

double base_lr(const Args& a) {
  if (a.optimizer == "sgd") return 0.05;
  if (a.optimizer == "sgd-plain") return 0.5;
  if (a.optimizer == "lamb") return 0.02;
  return 0.01;
}


// The last micro-step's events, in order, and one forward and one backward per unit per micro-step.
void check_unit_events(Engine& engine, int64_t micro_steps, int rank) {
  std::string got, want;
  for (const auto& [unit, event] : engine.units().trace())
    got += std::to_string(unit) + ":" + unit_event_name(event) + " ";
  for (int u = 0; u < 3; ++u) want += std::to_string(u) + ":forward_begin " + std::to_string(u) + ":forward_end ";
  for (int u = 2; u >= 0; --u) want += std::to_string(u) + ":backward_begin " + std::to_string(u) + ":backward_end ";
  if (got != want) throw std::runtime_error("unit events: got " + got + "\nwant " + want);
  for (int u = 0; u < engine.units().size(); ++u) {
    const UnitStats& st = engine.units().stats()[u];
    if (st.forwards != micro_steps || st.backwards != micro_steps)
      throw std::runtime_error("unit " + engine.units().unit(u).name + ": " + std::to_string(st.forwards) +
                               " forwards and " + std::to_string(st.backwards) + " backwards in " +
                               std::to_string(micro_steps) + " micro-steps");
  }
  if (rank == 0) std::printf("units ok: %s\n", got.c_str());
}

int run(const Args& a, ParallelContext* ctx) {
  const int dp = ctx->data().size(), rank = ctx->data().rank();
  Config config = load_config(config_text(a), ctx->world_size());
  Mlp model(a.seed_by_rank ? 42 + rank : 42, a.hidden, a.unused_off_rank0);
  ModelDescription description = describe(model, a.units);
  if (a.init) {  // as a model built under zero.Init would be: one layer at a time, then the engine
    PartitionedInit init(ctx->data());
    for (size_t first = 0; first < model.params.size(); first += 2)
      init.partition({model.params.begin() + first, model.params.begin() + std::min(first + 2, model.params.size())});
    if (model.params[0].storage().nbytes() > size_t(model.params[0].element_size()) || init.held_parameters() != int64_t(model.params.size()))
      throw std::runtime_error("zero.Init: a partitioned parameter still holds its bytes");
    init.take_shards(description);
  }
  Engine engine(config, *ctx, std::move(description));
  if (a.fill_nvme) {  // once every rank has built its engine
    at::Tensor built = at::zeros({1});
    ctx->data().all_reduce(built);
  }
  if (a.fill_nvme && rank == 0) {  // another job takes the disk's free space: the next write fails
    std::FILE* f = std::fopen(((a.nvme_path.empty() ? a.param_path : a.nvme_path) + "/filler").c_str(), "wb");
    std::vector<char> block(1 << 16, 1);
    while (f && std::fwrite(block.data(), 1, block.size(), f) == block.size() && std::fflush(f) == 0) {
    }
    if (f) std::fclose(f);
  }
  Reference reference(a);
  auto schedule = config.scheduler ? make_lr_schedule(config.scheduler->type, config.scheduler->params, base_lr(a))
                                   : make_lr_schedule("", {}, base_lr(a));

  // Right after construction every rank holds rank 0's parameters (the engine broadcasts them).
  // At stage 3 a model that names its units holds none (built whole, it starts released, as one
  // built partitioned does): the comparison with the reference after training shows them.
  const bool released = a.stage == 3 && (a.units || a.init);
  for (size_t i = 0; i < model.params.size() && !released; ++i)
    if (!at::equal(model.params[i].detach().to(at::kFloat), reference.model.params[i].detach().to(at::kFloat)) &&
        a.dtype == "fp32")
      throw std::runtime_error("parameter " + std::to_string(i) + " differs from rank 0's after construction");
  if (released && engine.memory().gathered_parameters != 0)
    throw std::runtime_error("stage 3: a model naming its units holds gathered parameters after construction");

  double max_loss_diff = 0, max_norm_diff = 0;
  std::vector<double> losses;  // for --dump
  int applied = 0;
  const int64_t rows = int64_t(a.mb) * a.gas * dp;
  for (int step = 0; step < a.steps; ++step) {
    auto [x, y] = global_batch(rows, step);
    at::Tensor extra_rows = a.unused_off_rank0 ? rank0_rows(rows, a.mb, dp) : at::Tensor();
    double engine_loss = 0;
    bool interrupted = false;
    for (int micro = 0; micro < a.gas && step != a.drop_engine_step; ++micro) {
      const int64_t begin = (int64_t(micro) * dp + rank) * a.mb;
      at::Tensor mine = a.unused_off_rank0 && rank == 0 ? extra_rows.narrow(0, begin, a.mb) : at::Tensor();
      const bool fail = step == a.throw_at_step && micro == a.gas - 1;
      if (a.units && step == a.steps - 1 && micro == a.gas - 1) engine.units().record_trace(true);
      at::Tensor loss = model.loss(x.narrow(0, begin, a.mb), y.narrow(0, begin, a.mb), mine, fail,
                                   a.units ? &engine : nullptr);
      if (step == a.inject_inf_step && rank == dp - 1) loss = loss * std::numeric_limits<float>::infinity();
      engine_loss += loss.item<double>() / a.gas;
      try {
        engine.backward(loss);
      } catch (const std::exception& e) {
        if (!fail) throw;
        interrupted = true;  // the engine discarded the window: so does the reference
        break;
      }
      engine.step();
      // (The first delayed step sends nothing yet: its update reaches the model at the next step.)
      const bool first_delayed = a.delayed >= 0 && step == a.delayed;
      // (A skipped step, an overflow's, gathers nothing either.)
      if (a.units && micro == a.gas - 1 && a.stage > 0 && a.stage < 3 && dp > 1 && !first_delayed &&
          step != a.inject_inf_step && !engine.parameters_in_flight())
        throw std::runtime_error("overlap_comm with units: the allgather was not left to the next forward");
      // ZeRO-3: between steps no unit's parameters are gathered (each was released after use).
      if (a.units && a.stage == 3 && engine.memory().gathered_parameters != 0)
        throw std::runtime_error("ZeRO-3: " + std::to_string(engine.memory().gathered_parameters) +
                                 " bytes of gathered parameters are still held after the step");
    }
    const bool skip = step == a.inject_inf_step || interrupted;
    if (step == a.throw_at_step) {
      if (!interrupted) throw std::runtime_error("the injected backward failure did not reach the caller");
      if (engine.micro_step() != int64_t(step) * a.gas)
        throw std::runtime_error("after an interrupted backward the micro-step count is not at the window start");
    }
    at::Tensor mean = at::full({1}, engine_loss, at::kDouble);
    ctx->data().all_reduce(mean, ReduceOp::Avg);
    losses.push_back(mean.item<double>());
    const double lr_now = schedule->lr_at(applied);
    const double ref_loss = reference.step(x, y, skip, lr_now, extra_rows);
    if (step == a.throw_at_step) continue;  // neither trained on it
    if (!skip) ++applied;
    if (step == a.drop_engine_step) continue;
    if (!skip) {
      max_loss_diff = std::max(max_loss_diff, std::abs(mean.item<double>() - ref_loss));
      max_norm_diff = std::max(max_norm_diff, std::abs(engine.last_grad_norm() - reference.last_norm) / reference.last_norm);
    }
  }

  // (A parameter one rank skips ends that rank's head unit late; a thrown backward skips units.)
  if (a.units && !a.unused_off_rank0 && a.throw_at_step < 0) check_unit_events(engine, int64_t(a.steps) * a.gas, rank);
  if (a.units && a.stage == 3 && a.reuse == 0 && !a.unused_off_rank0) {
    // The most held at once is below the whole model: the units came and went. (Not when units
    // are kept for reuse, nor when a parameter one rank skips keeps its unit to the backward's end.)
    const MemoryReport m = engine.memory();
    int64_t model_bytes = 0;
    for (const auto& p : model.params) model_bytes += p.numel() * p.element_size();
    if (rank == 0)
      std::printf("zero-3: gathered peak %lld bytes, model %lld bytes, parameters held %lld bytes\n",
                  (long long)m.gathered_parameters_peak, (long long)model_bytes, (long long)m.parameters);
    if (m.gathered_parameters_peak <= 0 || m.gathered_parameters_peak >= model_bytes)
      throw std::runtime_error("ZeRO-3: the gathered peak is not below the whole model");
  }
  engine.wait_for_parameters();  // read below outside a forward (a delayed update is applied first)
  reference.flush();
  auto whole = engine.gathered_parameters();  // ZeRO-3: every parameter gathered while reading them

  // The model's tensors are in the compute dtype: compare them with the reference rounded to it.
  // In bf16/fp16 one rounding step (an ulp, 0.004 near 1 in bf16) is as large as an update, so the
  // low-precision check compares means: the mean |difference| against the mean distance the
  // reference's parameters travelled. A dropped or doubled step moves every parameter by about
  // 1/steps of that distance; rounding noise averages far below it.
  double max_param_diff = 0, sum_param_diff = 0;
  int64_t count = 0;
  for (size_t i = 0; i < model.params.size(); ++i) {
    at::Tensor expected = reference.model.params[i].detach().to(model.params[i].scalar_type()).to(at::kFloat);
    at::Tensor diff = (model.params[i].detach().to(at::kFloat) - expected).abs();
    max_param_diff = std::max(max_param_diff, diff.max().item<double>());
    sum_param_diff += diff.sum().item<double>();
    count += diff.numel();
  }
  const double mean_param_diff = sum_param_diff / double(count);
  if (!a.dump.empty() && rank == 0) {  // byte for byte: offload must not change the arithmetic
    std::FILE* f = std::fopen(a.dump.c_str(), "wb");
    if (!f) throw std::runtime_error("cannot write " + a.dump);
    std::fwrite(losses.data(), sizeof(double), losses.size(), f);
    for (const auto& p : model.params) {
      at::Tensor bytes = p.detach().contiguous();
      std::fwrite(bytes.data_ptr(), 1, bytes.nbytes(), f);
    }
    std::fclose(f);
  }
  // Every rank must hold the same parameters after the allgather.
  for (auto& p : model.params) {
    at::Tensor mine = p.detach().to(at::kFloat).contiguous(), top = mine.clone();
    ctx->data().broadcast(top, 0);
    if (!at::equal(mine, top)) throw std::runtime_error("parameters differ between data-parallel ranks");
  }
  const bool fp32 = a.dtype == "fp32" && (a.comm_dtype.empty() || a.comm_dtype == "fp32");
  const double update = reference.mean_update();
  const double param_diff = fp32 ? max_param_diff : mean_param_diff;
  const double param_tolerance = fp32 ? 2e-5 : 0.1 * update;
  const double loss_tolerance = fp32 ? 2e-5 : 3e-2;
  const double norm_tolerance = fp32 ? 1e-4 : 5e-2;
  if (a.memory && rank == 0) {
    MemoryReport m = engine.memory();
    std::printf("memory: params %lld master %lld grads %lld states %lld buckets %lld host %lld host-params %lld\n",
                (long long)m.parameters, (long long)m.master_parameters, (long long)m.gradients,
                (long long)m.optimizer_states, (long long)m.buckets, (long long)m.host_optimizer_bytes,
                (long long)m.host_parameter_bytes);
  }
  if (a.super_offload && rank == 0) {
    const SpeculativeStep::Counts c = engine.speculation_counts();
    std::printf("speculated steps: kept %lld restored %lld, chunks stepped during backward %lld\n",
                (long long)c.committed, (long long)c.rolled_back, (long long)c.chunks);
  }
  if (rank == 0) {
    auto stat = [&](const char* collective) {
      auto it = ctx->data().stats().find(collective);
      return it == ctx->data().stats().end() ? CollectiveStats{} : it->second;
    };
    std::printf("data-group collectives: all_reduce %lld reduce_scatter %lld all_gather %lld\n",
                (long long)stat("all_reduce").calls, (long long)stat("reduce_scatter").calls,
                (long long)stat("all_gather").calls);
    std::printf("gradient bytes reduced: %lld\n", (long long)(stat("all_reduce").bytes + stat("reduce_scatter").bytes));
    std::printf("skipped steps %lld, global steps %lld, loss scale %g\n", (long long)engine.skipped_steps(),
                (long long)engine.global_step(), engine.loss_scale());
    std::printf("reference's mean update %.3g; tolerances: %s param %.2g, loss %.2g, relative norm %.2g\n", update,
                fp32 ? "max" : "mean", param_tolerance, loss_tolerance, norm_tolerance);
    const char* verdict = param_diff > param_tolerance || max_loss_diff > loss_tolerance ||
                                  max_norm_diff > norm_tolerance ? "MISMATCH" : "ok";
    std::printf("engine %s: max |dparam| %.3g, mean |dparam| %.3g, max |dloss| %.3g, max |dnorm|/norm %.3g\n",
                verdict, max_param_diff, mean_param_diff, max_loss_diff, max_norm_diff);
    if (std::string(verdict) != "ok") return 1;
  }
  return 0;
}

}  // namespace

// One case's arguments, argv[begin, end); false (with the message) for one it does not know.
static bool parse(Args& a, char** argv, int begin, int end) {
  for (int i = begin; i < end; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> std::string { return i + 1 < end ? argv[++i] : ""; };
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
    else if (k == "--units") a.units = true;
    else if (k == "--init") a.init = true;
    else if (k == "--rss") a.rss = true;
    else if (k == "--allreduce") a.allreduce = true;
    else if (k == "--comm-dtype") a.comm_dtype = next();
    else if (k == "--grad-accum") a.grad_accum = next();
    else if (k == "--layers") a.layers = std::stoi(next());
    else if (k == "--persist") a.persist = std::stoll(next());
    else if (k == "--reuse") a.reuse = std::stoll(next());
    else if (k == "--prefetch") a.prefetch = std::stoll(next());
    else if (k == "--offload") a.offload = next();
    else if (k == "--nvme-path") a.nvme_path = next();
    else if (k == "--offload-param") a.offload_param = next();
    else if (k == "--param-path") a.param_path = next();
    else if (k == "--param-buffers") a.param_buffers = std::stoi(next());
    else if (k == "--param-buffer-size") a.param_buffer_size = std::stoll(next());
    else if (k == "--tile") a.tile = std::stoll(next());
    else if (k == "--pipeline") a.pipeline = true;
    else if (k == "--buffers") a.buffers = std::stoi(next());
    else if (k == "--dump") a.dump = next();
    else if (k == "--delayed") a.delayed = a.reference_delay = std::stoi(next());
    else if (k == "--reference-delay") a.reference_delay = std::stoi(next());
    else if (k == "--super-offload") a.super_offload = true;
    else if (k == "--fill-nvme") a.fill_nvme = true;
    else if (k == "--seed-by-rank") a.seed_by_rank = true;
    else if (k == "--unused-off-rank0") a.unused_off_rank0 = true;
    else if (k == "--strict-unused") a.strict_unused = true;
    else if (k == "--throw-at-step") a.throw_at_step = std::stoi(next());
    else if (k == "--onecycle") a.onecycle = true;
    else if (k == "--drop-engine-step") a.drop_engine_step = std::stoi(next());
    else {
      std::fprintf(stderr, "engine worker: unknown argument %s\n", k.c_str());
      return false;
    }
  }
  return true;
}

// Cases separated by --then run in turn on one process group (one launch serving several cases:
// the tests' time is mostly process starts); each opens with a line "case N:" when there are several.
static int main_body(int argc, char** argv) {
  std::vector<Args> cases(1);
  for (int begin = 1, i = 1; i <= argc; ++i) {
    if (i < argc && std::string(argv[i]) != "--then") continue;
    if (!parse(cases.back(), argv, begin, i)) return 2;
    if (i < argc) cases.emplace_back();
    begin = i + 1;
  }
  try {
    for (const Args& c : cases)
      if ((c.memory_sweep || c.rss) && cases.size() > 1)
        throw std::invalid_argument("--memory-sweep and --rss measure a process of their own: not with --then");
    if (cases[0].memory_sweep) return memory_sweep(cases[0]);
    if (cases[0].rss) return peak_rss(cases[0]);
    auto ctx = ParallelContext::from_environment(ParallelOptions{});
    for (size_t i = 0; i < cases.size(); ++i) {
      if (cases.size() > 1 && ctx->rank() == 0) std::printf("case %zu:\n", i), std::fflush(stdout);
      ctx->data().reset_stats();  // each case counts its own collectives, as in a process of its own
      if (const int status = run(cases[i], ctx.get())) return status;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "engine worker error: %s\n", e.what());
    return 1;
  }
}

// Exits without LibTorch's static destructors (csrc/process_exit.h): main_body's objects are gone by then.
int main(int argc, char** argv) { tessera::exit_skipping_static_destructors(main_body(argc, argv)); }
