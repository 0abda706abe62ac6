// The memory estimator (engine/estimator/estimator.h): presets, hand-computed model states (a 7B model on
// 8 GPUs at each ZeRO stage), DeepSpeed's published formulas where the two describe the same thing,
// the verdict and the search, the JSON and the CLI. Activations (with MoE and context parallelism)
// are in test_estimator_activations.cpp; the estimate against the engine's measured memory in
// test_estimator_validation.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "engine/config/config_io.h"
#include "engine/estimator/estimator.h"
#include "examples/models/gpt.h"
#include "tests/subprocess.h"

using namespace tessera;
using nlohmann::json;
using tessera::testing::contains;

namespace {

EstimateInputs count_model(int64_t params, int gpus, int stage, const std::string& precision) {
  EstimateInputs in;
  in.model.params = params;
  in.model.largest_layer_params = 100000000;
  in.hardware.gpus_per_node = gpus;
  in.setup.zero_stage = stage;
  in.setup.precision = precision;
  in.search = false;
  return in;
}

int64_t states(const EstimateResult& r) { return r.per_gpu.model_states; }

// DeepSpeed's estimators (runtime/zero/stage_1_and_2.py, stage3.py), GPU side, bytes.
double ds_zero2_gpu(double P, int gpus, bool offload) { return offload ? 2 * P : 2 * P + 18 * P / gpus; }
double ds_zero3_gpu(double P, double largest, int gpus, bool off_opt, bool off_param) {
  const double L = 4 * largest;
  if (off_opt && off_param) return L;
  if (off_opt) return L + 2 * P / gpus;
  return L + 18 * P / gpus;
}

}  // namespace

TEST_CASE("presets: parameter counts from the shape formula") {
  auto count = [](const std::string& name) { return param_count(transformer_tensors(find_preset(name)->shape)); };
  CHECK(count("gpt2-small") == 124439808);   // GPT-2's published 124M
  CHECK(count("gpt2-medium") == 354823168);
  CHECK(count("gpt2-large") == 774030080);
  CHECK(count("gpt2-xl") == 1557611200);
  CHECK(count("llama-7b") == 6738415616);    // Llama-2 7B
  CHECK(count("llama-13b") == 13015864320);  // Llama-2 13B
  CHECK(count("llama-70b") == 68976648192);  // Llama-2 70B (GQA, 8 KV heads)
  CHECK(count("tessera-gpt") == 842496);
  // Largest module: the token embedding (DeepSpeed's largest_layer_params for these models).
  CHECK(largest_module_params(transformer_tensors(find_preset("llama-7b")->shape)) == 32000LL * 4096);
  CHECK_FALSE(find_preset("gpt5").has_value());
}

TEST_CASE("the tessera-gpt preset is examples/models/gpt.h's model - tensor by tensor - grouped as the examples do") {
  examples::Gpt gpt(examples::GptConfig{}, 1);
  std::vector<ParamTensor> tensors = transformer_tensors(find_preset("tessera-gpt")->shape);
  std::vector<ParamTensor> real;
  for (const auto& t : tensors)
    if (!t.tied_copy) real.push_back(t);
  REQUIRE(real.size() == gpt.parameters().size());
  for (size_t i = 0; i < real.size(); ++i) {
    INFO(gpt.parameter_names()[i] << " vs " << real[i].name);
    CHECK(real[i].numel == gpt.parameters()[i].numel());
    CHECK(real[i].group == (gpt.parameters()[i].dim() >= 2 ? 0 : 1));  // decay_groups: dim >= 2
  }
  CHECK(gpt.num_parameters() == 842496);
}

TEST_CASE("7B on 8 GPUs - bf16 + Adam: model states per GPU at each ZeRO stage - by hand") {
  const double P = 7e9, N = 8;  // 7e9 splits into 14 buckets of 5e8, each divisible by 8: no padding
  const double expected[4] = {
      2 * P + 4 * P + 4 * P + 8 * P,          // stage 0: bf16 params, fp32 master, fp32 grads, m+v = 18Ψ
      2 * P + 4 * P / N + 4 * P + 8 * P / N,  // stage 1: 6Ψ + 12Ψ/N
      2 * P + 4 * P / N + 4 * P / N + 8 * P / N,  // stage 2: 2Ψ + 16Ψ/N
      2 * P / N + 4 * P / N + 4 * P / N + 8 * P / N,  // stage 3: 18Ψ/N
  };
  for (int stage = 0; stage <= 3; ++stage) {
    EstimateResult r = estimate(count_model(7000000000LL, 8, stage, "bf16"));
    INFO("stage " << stage);
    CHECK(states(r) == static_cast<int64_t>(expected[stage]));
    CHECK(r.validated);  // every stage is the engine's planner
    CHECK(r.per_gpu.activations == 0);  // no shape, no activations
  }
  // The breakdown of stage 2.
  EstimateResult r2 = estimate(count_model(7000000000LL, 8, 2, "bf16"));
  CHECK(r2.per_gpu.bytes("parameters") == 14000000000LL);
  CHECK(r2.per_gpu.bytes("fp32 master weights") == 3500000000LL);
  CHECK(r2.per_gpu.bytes("gradients") == 3500000000LL);
  CHECK(r2.per_gpu.bytes("optimizer states") == 7000000000LL);
  // One group of 14 buckets: two fp32 staging buffers of reduce_bucket_size (5e8): one fills while
  // the other is reduced (in place: no receive chunks).
  CHECK(r2.per_gpu.bytes("communication buckets") == 2 * 4 * 500000000LL);
  // Stage 1: reduce-scatters in place into the whole gradient buffer (NCCL: no copy): nothing.
  CHECK(estimate(count_model(7000000000LL, 8, 1, "bf16")).per_gpu.bytes("communication buckets") == 0);
  // Stage 3: gathered largest module (1e8) + prefetch bucket (5e7) and the module's bf16 gradient.
  CHECK(estimate(count_model(7000000000LL, 8, 3, "bf16")).per_gpu.bytes("gathered parameters (ZeRO-3)") ==
        2 * (100000000LL + 50000000LL) + 2 * 100000000LL);
}

TEST_CASE("7B on 8 GPUs - fp32 + Adam: 16Ψ - 8Ψ + 8Ψ/N - 4Ψ + 12Ψ/N - 16Ψ/N") {
  const double P = 7e9, N = 8;
  const double expected[4] = {16 * P, 8 * P + 8 * P / N, 4 * P + 12 * P / N, 16 * P / N};
  for (int stage = 0; stage <= 3; ++stage) {
    INFO("stage " << stage);
    CHECK(states(estimate(count_model(7000000000LL, 8, stage, "fp32"))) == static_cast<int64_t>(expected[stage]));
  }
  // SGD with momentum keeps 4 bytes, without none.
  EstimateInputs sgd = count_model(7000000000LL, 8, 2, "fp32");
  sgd.setup.optimizer = "SGD";
  sgd.setup.momentum = 0.9;
  CHECK(estimate(sgd).per_gpu.bytes("optimizer states") == static_cast<int64_t>(4 * P / N));
  sgd.setup.momentum = 0;
  CHECK(estimate(sgd).per_gpu.bytes("optimizer states") == 0);
}

TEST_CASE("checkpoint.async_save: each rank's host copy of what it saves - fp32 values, compute copy, optimizer state") {
  const int64_t P = 7000000000LL, N = 8;  // 8 GPUs on one node
  for (int stage : {0, 2}) {
    EstimateInputs in = count_model(P, 8, stage, "bf16");
    const EstimateResult without = estimate(in);
    in.setup.async_checkpoint = true;
    const EstimateResult with = estimate(in);
    INFO("stage " << stage);
    // Stage 0: data rank 0 saves the replica (fp32 4Ψ + bf16 2Ψ + m, v 8Ψ); stage 2: its shard of it.
    const int64_t per_rank = stage == 0 ? 14 * P : 14 * P / N;
    CHECK(with.per_node_cpu.bytes("async checkpoint copy") == N * per_rank);
    CHECK(without.per_node_cpu.bytes("async checkpoint copy") == 0);
    CHECK(with.per_gpu.total == without.per_gpu.total);
  }
}

TEST_CASE("DeepSpeed's published formulas: equal where the two describe the same thing - documented differences elsewhere") {
  const double P = 7e9, L = 1e8;
  const int N = 8;
  // ZeRO-3 model states: DeepSpeed's 18P/N is tessera's 2 (bf16) + 4 (master) + 4 (fp32 grads) + 8 (m, v).
  EstimateResult z3 = estimate(count_model(7000000000LL, N, 3, "bf16"));
  CHECK(states(z3) == static_cast<int64_t>(ds_zero3_gpu(P, L, N, false, false) - 4 * L));
  // Its gathered-parameter term: DeepSpeed's 4·largest; tessera adds the prefetch bucket (5e7 bf16 elements).
  CHECK(z3.per_gpu.bytes("gathered parameters (ZeRO-3)") == static_cast<int64_t>(4 * L + 2 * 5e7));
  // ZeRO-2: DeepSpeed 2P + 18P/N counts an fp16 gradient partition (2P/N) tessera does not keep
  // (gradients are folded straight into fp32): tessera is 2Ψ/N lower.
  EstimateResult z2 = estimate(count_model(7000000000LL, N, 2, "bf16"));
  CHECK(static_cast<double>(states(z2)) == ds_zero2_gpu(P, N, false) - 2 * P / N);
  // ZeRO-2 + CPU offload: the GPU keeps the 16-bit parameters, 2P, as DeepSpeed says: each reduced
  // gradient chunk goes straight to the host (the engine's host path, validated in
  // tests/engine/estimator/test_estimator_validation.cpp).
  EstimateInputs off = count_model(7000000000LL, N, 2, "bf16");
  off.setup.offload_optimizer = "cpu";
  EstimateResult z2o = estimate(off);
  CHECK(static_cast<double>(states(z2o)) == ds_zero2_gpu(P, N, true));
  CHECK(z2o.validated);
  // ...and the node's CPU holds DeepSpeed's 16P of offloaded states plus the bf16 copy the CPU step
  // writes for the GPU, 2P: 18P (DeepSpeed: P·max(4·gpus, 16)·1.5; the 4·gpus term is each rank's
  // fp32 model built on the host, tessera's construction peak).
  CHECK(z2o.per_node_cpu.model_states == static_cast<int64_t>(18 * P));
  CHECK(z2o.per_node_cpu.construction == static_cast<int64_t>(4 * P * N));
  // ZeRO-3 + offload of the optimizer: GPU 2P/N of parameters (DeepSpeed L + 2P/N; tessera counts
  // the gathered window L apart), CPU 18P as above.
  EstimateInputs o3 = count_model(7000000000LL, N, 3, "bf16");
  o3.setup.offload_optimizer = "cpu";
  EstimateResult z3o = estimate(o3);
  CHECK(states(z3o) == static_cast<int64_t>(2 * P / N));
  CHECK(z3o.per_node_cpu.model_states == static_cast<int64_t>(18 * P));
  // ZeRO-3 + offload of optimizer and parameters: the GPU keeps no model state (DeepSpeed: L, the
  // gathered window), the CPU 18P, as DeepSpeed (the shard on the host is the copy the step writes).
  o3.setup.offload_param = "cpu";
  EstimateResult z3p = estimate(o3);
  CHECK(states(z3p) == 0);
  CHECK(z3p.per_node_cpu.model_states == static_cast<int64_t>(18 * P));
  // ZeRO-Infinity (both to NVMe), as the engine runs it on GPU ranks: the files hold the fp32 master
  // and the moments (12P) and the bf16 parameter shards (2P), 14P, where DeepSpeed's formula puts
  // the fp32 gradients there too (18P); the host keeps the gradient shards (4P, as with CPU offload)
  // and the swap buffers: the optimizer's 4 tiles of 16M elements × (m, v, master) (the swapper's
  // cut of an 875M-element shard, offload/swap_tiles.h) and the parameters' 5 of the largest chunk.
  o3.setup.offload_optimizer = "nvme";
  o3.setup.offload_param = "nvme";
  o3.hardware.nvme_capacity = 1024 * kGiB;
  EstimateResult z3n = estimate(o3);
  CHECK(z3n.validated);
  CHECK(states(z3n) == 0);
  // (each chunk and tile 4096-aligned in its file: a few MB over 14P)
  const int64_t padding = z3n.per_node_nvme.model_states - static_cast<int64_t>(14 * P);
  CHECK(padding >= 0);
  CHECK(padding < static_cast<int64_t>(1e-4 * 14 * P));
  const int64_t optimizer_buffers = 4 * int64_t(16000000) * 4 * 3;
  const int64_t host_buffers = z3n.per_node_cpu.model_states - static_cast<int64_t>(4 * P) - N * optimizer_buffers;
  CHECK(host_buffers > 0);  // 5 parameter chunks per rank, each at most a bucket (5e8 bf16 elements)
  CHECK(host_buffers <= N * 5 * int64_t(500000000) * 2);
}

TEST_CASE("tensor and pipeline parallelism divide the parameters per GPU") {
  EstimateInputs in;
  in.model.name = "gpt2-xl";
  in.model.shape = find_preset("gpt2-xl")->shape;
  in.hardware.gpus_per_node = 8;
  in.setup.precision = "bf16";
  in.search = false;
  const int64_t whole = estimate(in).params_per_gpu;
  CHECK(whole == 1557611200);
  in.setup.tp = 2;
  in.setup.pp = 2;
  EstimateResult r = estimate(in);
  // The busiest GPU is on the last stage (its fp32 logits): 24 layers, the tied head's copy and
  // the final norm. Per layer, split by t = 2: QKV 3h² + 3h, attention out h², MLP 8h² + 4h;
  // replicated: two LayerNorms 4h, the row-parallel biases 2h.
  const int64_t h = 1600, layer = (12 * h * h + 7 * h) / 2 + 6 * h;
  CHECK(r.activations.stage == 1);
  CHECK(r.params_per_gpu == 24 * layer + 50257 * h / 2 + 2 * h);
}

TEST_CASE("verdict and search: fits or by how much - cheapest options first") {
  EstimateInputs in;
  in.model.name = "llama-7b";
  in.model.shape = find_preset("llama-7b")->shape;
  in.hardware.gpus_per_node = 8;
  in.hardware.gpu_memory = 80 * kGiB;
  in.hardware.cpu_memory = 1024 * kGiB;
  in.setup.precision = "bf16";
  in.setup.zero_stage = 0;
  EstimateResult r = estimate(in);
  CHECK_FALSE(r.fits);
  REQUIRE(r.shortfalls.size() == 1);
  CHECK(contains(r.shortfalls[0], "per GPU"));
  CHECK(r.per_gpu.total > r.per_gpu.capacity);
  // The table covers every stage x offload choice: 1 + 2 + 2 + 6 rows.
  CHECK(r.table.size() == 11);
  REQUIRE_FALSE(r.options.empty());
  // Cheapest first: no option is preceded by a costlier one.
  for (size_t i = 1; i < r.options.size(); ++i)
    CHECK(r.options[i - 1].cost.total() <= r.options[i].cost.total() * (1 + 1e-9));
  CHECK(r.options.front().offload_optimizer == "none");
  // The reported micro-batch is the largest power of two that fits, and the option's memory is
  // what that micro-batch needs.
  const OptionRow best = r.options.front();
  EstimateInputs check = in;
  check.search = false;
  check.setup.zero_stage = best.zero_stage;
  check.setup.activation_checkpointing = best.activation_checkpointing;
  check.setup.micro_batch = best.max_micro_batch;
  CHECK(best.micro_batch == best.max_micro_batch);
  CHECK(estimate(check).fits);
  CHECK(estimate(check).per_gpu.total == best.per_gpu);
  check.setup.micro_batch = best.max_micro_batch * 2;
  CHECK_FALSE(estimate(check).fits);
  // Nothing fits on a tiny GPU, even with full checkpointing: the note says so.
  in.hardware.gpu_memory = 2 * kGiB;
  EstimateResult tiny = estimate(in);
  CHECK_FALSE(tiny.fits);
  CHECK(tiny.options.empty());
  CHECK(contains(tiny.options_note, "checkpointing"));
}

TEST_CASE("search: every stage x offload x checkpointing that fits - ranked by the cost model - the headline example") {
  // README's and docs/estimator.md's example: llama-7b, bf16, 8 GPUs of 80 GiB, 1 TiB of CPU memory.
  EstimateInputs in;
  in.model.name = "llama-7b";
  in.model.shape = find_preset("llama-7b")->shape;
  in.hardware.gpus_per_node = 8;
  in.hardware.gpu_memory = 80 * kGiB;
  in.hardware.cpu_memory = 1024 * kGiB;
  in.setup.precision = "bf16";
  in.setup.zero_stage = 2;
  auto find = [](const EstimateResult& r, int stage, const std::string& ckpt, const std::string& offload = "none") {
    for (const auto& o : r.options)
      if (o.zero_stage == stage && o.activation_checkpointing == ckpt && o.offload_optimizer == offload &&
          o.offload_param == "none")
        return o;
    FAIL("no option zero_stage=" << stage << " checkpointing " << ckpt << " offload " << offload);
    return OptionRow{};
  };
  EstimateResult r = estimate(in);
  REQUIRE_FALSE(r.options.empty());
  const OptionRow& first = r.options.front();
  INFO(format_estimate(r));
  // SDPA: ZeRO-2 fits without checkpointing at micro-batch 2, and costs least: no recomputation,
  // and 4Ψ of fp32 gradients reduce-scattered per micro-step + 2Ψ of bf16 parameters allgathered
  // per step, where ZeRO-3 allgathers the parameters in the forward and again in the backward.
  CHECK(first.zero_stage == 2);
  CHECK(first.activation_checkpointing == "none");
  CHECK(first.max_micro_batch == 2);
  CHECK(first.offload_optimizer == "none");
  CHECK(first.validated);
  // ZeRO-2 with full checkpointing fits at micro-batch 16 and is in the list, costing one more
  // forward of the layers: 32 layers of 2·(4h² + 3hf) + 4sh FLOPs per token, against 3 forwards
  // of the layers and the head (2hV): 0.327 of the compute.
  const OptionRow z2_full = find(r, 2, "full");
  CHECK(z2_full.max_micro_batch == 16);
  const double h = 4096, f = 11008, S = 4096, V = 32000;
  const double layer = 2 * (4 * h * h + 3 * h * f) + 4 * S * h, forward = 32 * layer + 2 * h * V;
  CHECK(z2_full.cost.recompute / z2_full.cost.compute == Approx(32 * layer / (3 * forward)).epsilon(1e-9));
  CHECK(z2_full.cost.recompute / z2_full.cost.compute == Approx(0.327).margin(0.001));
  // ZeRO-3 without checkpointing fits at the same micro-batch 2 and moves 8Ψ per micro-step to
  // ZeRO-2's 6Ψ (gas 1): 4/3 of ZeRO-2's communication (Rajbhandari et al.'s 1.5x with 16-bit gradients).
  const OptionRow z3 = find(r, 3, "none");
  CHECK(z3.max_micro_batch == 2);
  CHECK(z3.cost.communication / first.cost.communication == Approx(4.0 / 3).epsilon(1e-3));
  CHECK(first.cost.total() < z3.cost.total());
  CHECK(first.cost.total() < z2_full.cost.total());
  // Every ZeRO-3 option ranks after the first ZeRO-2 one.
  size_t first_z3 = r.options.size(), first_z2 = r.options.size();
  for (size_t i = r.options.size(); i-- > 0;) {
    if (r.options[i].zero_stage == 3) first_z3 = i;
    if (r.options[i].zero_stage == 2) first_z2 = i;
  }
  CHECK(first_z2 < first_z3);
  // The report shows the cost of each option.
  const std::string text = format_estimate(r);
  CHECK(contains(text, "1. zero_stage=2, offload_optimizer=none, offload_param=none, checkpointing none: micro-batch up to 2"));
  CHECK(contains(text, "; cost 1."));

  // With eager attention (the estimator's old default) nothing at ZeRO-2 fits without
  // checkpointing; the old search put ZeRO-3 (micro-batch 1) first. ZeRO-2 with checkpointing
  // fits — full at micro-batch 16, selective (which drops exactly the s² terms) at 2 — and is cheaper.
  in.setup.attention = "eager";
  EstimateResult e = estimate(in);
  REQUIRE_FALSE(e.options.empty());
  INFO(format_estimate(e));
  CHECK(e.options.front().zero_stage == 2);
  CHECK(e.options.front().activation_checkpointing != "none");
  CHECK(find(e, 2, "full").max_micro_batch == 16);
  CHECK(find(e, 3, "none").max_micro_batch == 1);
  CHECK(e.options.front().cost.total() < find(e, 3, "none").cost.total());
  for (const auto& o : e.options)
    CHECK_FALSE((o.zero_stage <= 2 && o.activation_checkpointing == "none" && o.offload_optimizer == "none"));
}

TEST_CASE("the CPU and NVMe capacities are checked when given") {
  EstimateInputs in = count_model(7000000000LL, 8, 3, "bf16");
  in.setup.offload_optimizer = "nvme";
  in.hardware.nvme_capacity = 50 * kGiB;  // needs 16Ψ = 112e9 bytes
  EstimateResult r = estimate(in);
  CHECK_FALSE(r.fits);
  CHECK_FALSE(r.per_node_nvme.fits());
  in.hardware.nvme_capacity = 200 * kGiB;
  in.hardware.cpu_memory = 16 * kGiB;  // pinned buffers + 8 ranks' process overhead (1 GiB each) + construction
  EstimateResult c = estimate(in);
  CHECK(c.per_node_nvme.fits());
  CHECK_FALSE(c.per_node_cpu.fits());
  CHECK(contains(c.shortfalls.at(0), "per node CPU"));
}

TEST_CASE("JSON: the documented keys - and requests with the CLI's flags as keys") {
  json j = estimate_json({{"preset", "gpt2-small"}, {"zero", 2}, {"bf16", true}, {"gpus_per_node", 4},
                          {"gpu_mem", 24}, {"micro_batch", 4}});
  CHECK(j["fits"].is_boolean());
  for (const char* k : {"total_bytes", "model_states_bytes", "activations_bytes"}) CHECK(j["per_gpu"][k].is_number());
  CHECK(j["per_node_cpu"]["total_bytes"].is_number());
  CHECK(j["per_node_nvme"]["total_bytes"].is_number());
  CHECK(j["validated"] == true);
  CHECK(j["setup"]["zero_stage"] == 2);
  CHECK(j["setup"]["micro_batch"] == 4);
  CHECK(j["hardware"]["gpu_memory_bytes"] == 24 * kGiB);
  CHECK(j["table"].size() == 11);
  CHECK(j["per_gpu"]["activations_bytes"].get<int64_t>() > 0);
  // A config file's choices, flags overriding its keys.
  json c = estimate_json({{"params", 1000000}, {"config", TESSERA_SOURCE_DIR "/configs/zero2_bf16.json"},
                          {"gpus_per_node", 2}, {"search", false}});
  CHECK(c["setup"]["zero_stage"] == 2);
  CHECK(c["setup"]["precision"] == "bf16");
  json c1 = estimate_json({{"params", 1000000}, {"config", TESSERA_SOURCE_DIR "/configs/zero2_bf16.json"},
                           {"zero", 1}, {"gpus_per_node", 2}, {"search", false}});
  CHECK(c1["setup"]["zero_stage"] == 1);
  // Mistakes are errors that say what is wrong.
  CHECK_THROWS_WITH(estimate_json({{"params", 1000}, {"gpus_per_nod", 2}}), Catch::Contains("did you mean \"gpus_per_node\""));
  CHECK_THROWS_WITH(estimate_json({{"gpus_per_node", 2}}), Catch::Contains("no model"));
  CHECK_THROWS_WITH(estimate_json({{"layers", 2}, {"hidden", 64}}), Catch::Contains("--heads"));
  CHECK_THROWS_WITH(estimate_json({{"params", 1000}, {"zero", 2}, {"offload_param", "cpu"}}),
                    Catch::Contains("offload_param needs ZeRO stage 3"));
  CHECK_THROWS_WITH(estimate_json({{"params", 1000}, {"tp", 3}, {"gpus_per_node", 8}}), Catch::Contains("tp_size"));
  CHECK(parse_memory_size("80") == 80 * kGiB);
  CHECK(parse_memory_size("512MiB") == 512LL << 20);
  CHECK(parse_memory_size("2TB") == 2048 * kGiB);
  CHECK_THROWS(parse_memory_size("lots"));
}

TEST_CASE("every shipped config in configs/ can be estimated - its choices read as the engine reads them") {
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(TESSERA_SOURCE_DIR "/configs")) {
    if (entry.path().extension() != ".json") continue;
    ++files;
    INFO(entry.path().string());
    json j = estimate_json({{"params", 1000000000}, {"largest_layer_params", 10000000}, {"config", entry.path().string()},
                            {"gpus_per_node", 8}, {"nvme", "2TiB"}, {"search", false}});
    CHECK(j["per_gpu"]["total_bytes"].get<int64_t>() > 0);
    ResolvedLayout layout;
    Config config = load_config(entry.path().string(), 8, &layout);
    CHECK(j["setup"]["zero_stage"] == config.zero_optimization.stage);
    CHECK(j["setup"]["offload_optimizer"] == config.zero_optimization.offload_optimizer.device);
    CHECK(j["setup"]["tp"] == layout.tensor);
    CHECK(j["setup"]["pp"] == layout.pipe);
    CHECK(j["setup"]["dp"] == layout.data);
  }
  CHECK(files >= 10);
}

TEST_CASE("tessera estimate: the table - the verdict as exit status - --json") {
  auto r = tessera::testing::run({TESSERA_CLI_PATH, "estimate", "--preset", "llama-7b", "--bf16", "--zero", "3",
                                  "--gpus-per-node", "8", "--gpu-mem", "80", "--activation-checkpointing"},
                                 {}, 60);
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(contains(r.output, "per CPU |    per GPU |  per NVMe"));
  CHECK(contains(r.output, "offload_param=none, offload_optimizer=none, zero_stage=3"));
  CHECK(contains(r.output, "checked against its measured memory"));  // ZeRO-3 is the engine's planner too
  CHECK(contains(r.output, "Cheapest options that fit"));
  auto j = tessera::testing::run({TESSERA_CLI_PATH, "estimate", "--params", "70B", "--largest-layer-params", "1B",
                                  "--gpus-per-node", "8", "--bf16", "--zero", "2", "--json"},
                                 {}, 60);
  INFO(j.output);
  CHECK(j.status == 1);  // 2Ψ + 16Ψ/8 = 280 GB per GPU: does not fit
  json parsed = json::parse(j.output);
  CHECK(parsed["fits"] == false);
  CHECK(parsed["per_gpu"]["model_states_bytes"] == 140000000000LL + 140000000000LL);
  auto eager = tessera::testing::run({TESSERA_CLI_PATH, "estimate", "--preset", "llama-7b", "--bf16", "--zero", "2",
                                      "--gpus-per-node", "8", "--attention", "eager", "--json"},
                                     {}, 60);
  INFO(eager.output);
  json eager_json = json::parse(eager.output);
  CHECK(eager_json["setup"]["attention"] == "eager");
  CHECK(eager_json["per_gpu"]["activations_bytes"] == 52722401280LL);
  CHECK(eager_json["options"].at(0)["cost"]["relative"].get<double>() >= 1.0);
  auto bad = tessera::testing::run({TESSERA_CLI_PATH, "estimate", "--preset", "nope"}, {}, 60);
  CHECK(bad.status == 2);
  CHECK(contains(bad.output, "unknown preset"));
}
