// The memory estimator's activations (engine/estimator/estimator_activations.cpp): Korthikanti et
// al.'s per-layer formulas with tensor/sequence parallelism, checkpointing, pipelines and the
// logits; SDPA's attention memory by default and eager attention's on request; MoE's experts over
// ep with activations at the capacity; context parallelism's activations per rank over cp. Model
// states, the search and the CLI are in test_estimator.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/estimator/estimator.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/simulator.h"

using namespace tessera;
using nlohmann::json;

TEST_CASE("activations: Korthikanti et al.'s per-layer formulas - checkpointing - pipelines - logits") {
  // A GPT shape (ffn 4h, MHA, dropout) with eager attention (s×s scores stored): the paper's case exactly.
  TransformerShape sh;
  sh.layers = 2, sh.hidden = 64, sh.heads = 4, sh.vocab = 1000, sh.seq_len = 32;
  const double s = 32, b = 2, h = 64, a = 4, V = 1000, sbh = s * b * h;
  std::string attention = "eager";
  auto run = [&](int tp, bool sp, const std::string& ckpt, const std::string& precision = "bf16") {
    EstimateInputs in;
    in.model.shape = sh;
    in.hardware.gpus_per_node = tp;
    in.setup.attention = attention;
    in.setup.precision = precision;
    in.setup.micro_batch = 2;
    in.setup.tp = tp;
    in.setup.sequence_parallel = sp;
    in.setup.activation_checkpointing = ckpt;
    in.search = false;
    return estimate(in);
  };
  EstimateResult r = run(1, false, "none");
  CHECK(r.activations.per_layer_full == static_cast<int64_t>(sbh * (34 + 5 * a * s / h)));
  const int64_t output = static_cast<int64_t>(2 * 2 * sbh + 8 * s * b * V);  // final norm + head inputs, fp32 logits + grad
  CHECK(r.activations.logits == output);
  CHECK(r.activations.embedding == static_cast<int64_t>(sbh));  // embedding dropout mask
  CHECK(r.per_gpu.activations == 2 * r.activations.per_layer_full + output + static_cast<int64_t>(sbh));
  // Tensor parallelism t = 2: sbh(10 + 24/t + 5as/(ht)); with sequence parallelism sbh(34/t + 5as/(ht)).
  CHECK(run(2, false, "none").activations.per_layer_full == static_cast<int64_t>(sbh * (10 + 24 / 2.0 + 5 * a * s / (h * 2))));
  CHECK(run(2, true, "none").activations.per_layer_full == static_cast<int64_t>(sbh * (34 / 2.0 + 5 * a * s / (h * 2))));
  CHECK(run(2, false, "none").activations.logits == static_cast<int64_t>(2 * 2 * sbh + 8 * s * b * V / 2));
  // Selective recomputation drops the attention core (5as/h).
  CHECK(run(1, false, "selective").activations.per_layer == static_cast<int64_t>(sbh * 34));
  // Full checkpointing: each layer keeps its 2sbh input; one layer is rebuilt during the backward,
  // after the output layer's buffers are freed (the larger of the two counts).
  EstimateResult full = run(1, false, "full");
  CHECK(full.activations.per_layer == static_cast<int64_t>(2 * sbh));
  CHECK(full.activations.recompute == r.activations.per_layer_full);
  CHECK(full.per_gpu.activations ==
        static_cast<int64_t>(2 * 2 * sbh) + std::max(r.activations.per_layer_full, output) + static_cast<int64_t>(sbh));
  // fp32: the 2-byte activations double, the 1-byte dropout masks do not: sbh(84 - 4 + ...) here.
  CHECK(run(1, false, "none", "fp32").activations.per_layer_full ==
        static_cast<int64_t>(sbh * (2 * 34 - 2) + (2 * 5 - 1) * a * s * s * b));
  // SDPA keeps no s×s scores, only the fp32 log-sum-exp; the 1-byte dropout masks after attention
  // and MLP stay (2sbh of the 34sbh), the attention-probability dropout is regenerated.
  attention = "sdpa";
  CHECK(run(1, false, "none").activations.per_layer_full == static_cast<int64_t>(sbh * 34 + 4 * a * s * b));
  CHECK(run(2, false, "none").activations.per_layer_full ==
        static_cast<int64_t>(sbh * (10 + 24 / 2.0) + 4 * a * s * b / 2));
}

TEST_CASE("activations: SDPA by default - llama-7b at micro-batch 1 stores 17.12 GiB - eager attention 49.10 GiB") {
  // Llama-2 7B, bf16 (e = 2), s = 4096, b = 1, h = 4096, a = 32 heads, SwiGLU f = 11008, V = 32000,
  // 32 layers, no dropout. Per layer, bytes:
  //   norm inputs, QKV input, MLP input 4e·sbh; Q and the output projection's input (= SDPA's
  //   output) 2e·sbh; K, V 2e·sbh; SwiGLU gate, up, product 3e·sbf;
  //   attention core: sdpa the fp32 log-sum-exp 4·a·s·b; eager the softmax output e·a·s²·b.
  // Plus the output layer: final norm and head inputs 2e·sbh, fp32 logits and their gradient 8·sbV.
  const int64_t s = 4096, b = 1, h = 4096, a = 32, f = 11008, V = 32000, L = 32, sbh = s * b * h;
  const int64_t output = 4 * sbh + 8 * s * b * V;
  const int64_t sdpa_layer = 16 * sbh + 6 * s * b * f + 4 * a * s * b;  // 539,492,352 B = 0.50 GiB
  const int64_t eager_layer = 16 * sbh + 6 * s * b * f + 2 * a * s * s * b;  // 1.50 GiB: the s² term is 1 GiB
  const int64_t sdpa_total = L * sdpa_layer + output, eager_total = L * eager_layer + output;
  CHECK(sdpa_total == 18379440128LL);   // 17.12 GiB
  CHECK(eager_total == 52722401280LL);  // 49.10 GiB, the figure the estimator printed before SDPA was the default

  EstimateInputs in;
  in.model.name = "llama-7b";
  in.model.shape = find_preset("llama-7b")->shape;
  in.hardware.gpus_per_node = 8;
  in.setup.precision = "bf16";
  in.setup.zero_stage = 2;
  in.search = false;
  EstimateResult r = estimate(in);  // the default: SDPA
  CHECK(r.setup.attention == "sdpa");
  CHECK(r.activations.per_layer_full == sdpa_layer);
  CHECK(r.per_gpu.activations == sdpa_total);
  CHECK(format_gib(r.per_gpu.activations) == "17.12GiB");
  in.setup.attention = "eager";
  EstimateResult e = estimate(in);
  CHECK(e.activations.per_layer_full == eager_layer);
  CHECK(e.per_gpu.activations == eager_total);
  CHECK(format_gib(e.per_gpu.activations) == "49.10GiB");
  // The same through a request (the CLI's --attention and tessera.estimate(attention=...)); the
  // old --flash-attention flag (flash_attention: true/false) still reads as sdpa/eager.
  json req = {{"preset", "llama-7b"}, {"bf16", true}, {"zero", 2}, {"gpus_per_node", 8}, {"search", false}};
  CHECK(estimate_json(req)["per_gpu"]["activations_bytes"] == sdpa_total);
  CHECK(estimate_json(req)["setup"]["attention"] == "sdpa");
  req["attention"] = "eager";
  CHECK(estimate_json(req)["per_gpu"]["activations_bytes"] == eager_total);
  req.erase("attention");
  req["flash_attention"] = false;
  CHECK(estimate_json(req)["per_gpu"]["activations_bytes"] == eager_total);
  req["attention"] = "sdpa";
  CHECK_THROWS_WITH(estimate_json(req), Catch::Contains("contradicts"));
  req.erase("flash_attention");
  req["attention"] = "flash";
  CHECK_THROWS_WITH(estimate_json(req), Catch::Contains("sdpa or eager"));
}

TEST_CASE("activations: a 1F1B pipeline's first stage holds `stages` micro-batches of its layers - other schedules their simulated peak") {
  TransformerShape sh;
  sh.layers = 4, sh.hidden = 64, sh.heads = 4, sh.vocab = 100, sh.seq_len = 32;
  EstimateInputs in;
  in.model.shape = sh;
  in.hardware.gpus_per_node = 2;
  in.setup.precision = "bf16";
  in.setup.micro_batch = 2;
  in.setup.pp = 2;
  in.setup.gradient_accumulation = 4;
  in.search = false;
  EstimateResult r = estimate(in);
  REQUIRE(r.activations.stage == 0);
  CHECK(r.activations.layers_held == 2);
  CHECK(r.activations.in_flight == 2);  // min(stages - 0, micro-batches)
  CHECK(r.activations.embedding == 2 * 32 * 2 * 64);  // two micro-batches' embedding dropout masks (sbh bytes each)
  CHECK(r.per_gpu.activations == 2 * 2 * r.activations.per_layer_full + r.activations.embedding);
  CHECK_FALSE(r.validated);
  in.setup.gradient_accumulation = 1;  // one micro-batch: nothing else in flight
  CHECK(estimate(in).activations.in_flight == 1);
  // Other schedules hold what the simulator counts at their peak. Interleaved 1F1B, two chunks a
  // stage, four micro-batches: stage 0 warms up with (p - 1)·2 + (v - 1)·p = 4 chunk forwards and
  // holds 5 half-stage chunks at its peak, 3 micro-batches rounded up (1F1B: 2).
  in.setup.gradient_accumulation = 4;
  in.setup.pipeline_schedule = "interleaved_1f1b";
  in.setup.virtual_stages = 2;
  CHECK(pipeline::simulate(pipeline::interleaved_one_f_one_b(2, 4, 2)).peak_activations[0] == 5);
  const EstimateResult interleaved = estimate(in);
  CHECK(interleaved.activations.in_flight == 3);
  CHECK(interleaved.per_gpu.activations > r.per_gpu.activations);
  // ZB-H1: the first stage holds 1F1B's 2; the last, deferring a weight gradient, 2 instead of 1.
  in.setup.pipeline_schedule = "zb_h1";
  in.setup.virtual_stages = 1;
  CHECK(estimate(in).activations.in_flight == 2);
  CHECK(pipeline::simulate(pipeline::zb_h1(2, 4)).peak_activations[1] == 2);
  // ZB-V: two half-stage chunks a stage; stage 0 holds at most 1F1B's 2 micro-batches' worth, and the
  // head's logits (the V's last chunk is on stage 0).
  in.setup.pipeline_schedule = "zb_v";
  in.setup.virtual_stages = 2;
  CHECK(pipeline::simulate(pipeline::zb_v(2, 4)).peak_activations[0] <= 4);
  const EstimateResult v = estimate(in);
  CHECK(v.activations.in_flight <= 2);
}

TEST_CASE("MoE: experts counted over ep - activations at the capacity or the stated dropless worst case - the flags' errors") {
  // tessera-gpt (4 layers, hidden 128, sequence 128): 8 experts in blocks 1 and 3, micro-batch 4.
  auto moe = [](json more) {
    json request = {{"preset", "tessera-gpt"}, {"device", "cpu"}, {"gpus_per_node", 4}, {"micro_batch", 4},
                    {"moe_experts", 8}, {"search", false}};
    if (more.is_object()) request.update(more);
    return estimate_json(request);
  };
  const json dense = estimate_json({{"preset", "tessera-gpt"}, {"device", "cpu"}, {"gpus_per_node", 4},
                                    {"micro_batch", 4}, {"search", false}});
  const int64_t expert = 2 * (128 * 512) + 512 + 128;  // one expert: the MLP's c_fc and c_proj
  const int64_t router = 8 * 128;
  const json ep1 = moe({}), ep2 = moe({{"ep", 2}}), ep4 = moe({{"ep", 4}});
  // Each MoE block: the dense MLP replaced by the router and E/ep experts.
  CHECK(ep1["model"]["params_per_gpu"].get<int64_t>() == dense["model"]["params_per_gpu"].get<int64_t>() + 2 * (router + 7 * expert));
  CHECK(ep2["model"]["params_per_gpu"].get<int64_t>() == dense["model"]["params_per_gpu"].get<int64_t>() + 2 * (router + 3 * expert));
  CHECK(ep4["model"]["params_per_gpu"].get<int64_t>() == dense["model"]["params_per_gpu"].get<int64_t>() + 2 * (router + 1 * expert));
  CHECK(ep2["activations"]["moe_layers"] == 2);
  // Dropless: the worst case, every choice of the ep group here: ep · k · T rows (T = 4 · 128).
  CHECK(ep2["activations"]["moe_rows"] == 2 * 2 * 512);
  CHECK(ep4["activations"]["moe_rows"] == 4 * 2 * 512);
  // With a capacity: E · ceil(T / E · cf · k) rows whatever ep is.
  CHECK(moe({{"ep", 2}, {"moe_drop_tokens", true}})["activations"]["moe_rows"] == 8 * 128);
  CHECK(moe({{"ep", 2}, {"moe_drop_tokens", true}, {"moe_capacity_factor", 0.5}})["activations"]["moe_rows"] == 8 * 64);
  bool noted = false;
  for (const auto& n : ep2["notes"]) noted |= n.get<std::string>().find("dropless worst case") != std::string::npos;
  CHECK(noted);
  CHECK_THROWS_WITH(moe({{"ep", 3}}), Catch::Contains("moe.ep_size") && Catch::Contains("does not divide num_experts 8"));
  CHECK_THROWS_WITH(moe({{"ep", 8}}), Catch::Contains("does not divide the data-parallel size 4"));
  CHECK_THROWS_WITH(moe({{"moe_k", 9}}), Catch::Contains("moe.k"));
}

TEST_CASE("context parallelism: activations per rank over cp - Ulysses's and ring's extra and buffers - the flags' errors") {
  // tessera-gpt (4 layers, hidden 128, 4 heads, sequence 128), fp32, micro-batch 4, 4 CPU ranks.
  auto est = [](json more) {
    json request = {{"preset", "tessera-gpt"}, {"device", "cpu"}, {"gpus_per_node", 4}, {"micro_batch", 4},
                    {"search", false}};
    request.update(more);
    return estimate_json(request);
  };
  const json one = est(json::object()), ulysses = est({{"cp", 2}}), ring = est({{"cp", 2}, {"cp_method", "ring"}}),
             ring4 = est({{"cp", 4}, {"cp_method", "ring"}});
  const int64_t full = one["activations"]["per_layer_full_bytes"];
  const double S = 64, b = 4, h = 128, e = 4;  // this rank's tokens at cp 2
  // The per-token terms halve; Ulysses keeps the output in both layouts, ring its fp32 merge.
  CHECK(ulysses["activations"]["context_extra_bytes"] == int64_t(e * S * b * h));
  CHECK(ring["activations"]["context_extra_bytes"] == int64_t(4 * S * b * h));
  CHECK(std::abs(ulysses["activations"]["per_layer_full_bytes"].get<int64_t>() - (full / 2 + int64_t(e * S * b * h))) <= 8);
  CHECK(std::abs(ring4["activations"]["per_layer_full_bytes"].get<int64_t>() - (full / 4 + int64_t(4 * 32 * b * h))) <= 8);
  // Transient: Ulysses's all-to-all buffers of q, k, v (send and receive); ring's blocks in flight
  // and, in the backward, three fp32 gradient accumulators.
  CHECK(ulysses["activations"]["context_buffer_bytes"] == int64_t(2 * e * S * b * 3 * h));
  CHECK(ring["activations"]["context_buffer_bytes"] == int64_t(2 * e * S * b * 2 * h + 3 * 4 * S * b * 2 * h));
  CHECK(one["activations"]["context_buffer_bytes"] == 0);
  CHECK(ulysses["setup"]["cp"] == 2);
  CHECK(ring["setup"]["cp_method"] == "ring");
  CHECK(ring4["per_gpu"]["total_bytes"].get<int64_t>() < one["per_gpu"]["total_bytes"].get<int64_t>());
  // Model states do not change: ZeRO partitions over data x context, the same ranks as before.
  CHECK(est({{"cp", 2}, {"zero", 2}})["per_gpu"]["model_states_bytes"] == est({{"zero", 2}})["per_gpu"]["model_states_bytes"]);
  CHECK_THROWS_WITH(est({{"cp", 3}}), Catch::Contains("context_parallel.size"));
  CHECK_THROWS_WITH(est({{"cp", 2}, {"cp_method", "zigzag"}}), Catch::Contains("context_parallel.method"));
}
