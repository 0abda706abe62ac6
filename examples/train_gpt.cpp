// train_gpt: a byte-level GPT (examples/models/gpt.h) on the `fortunes` corpus, trained by the
// tessera Engine with whatever the DeepSpeed-style config asks for (ZeRO stage, bf16/fp16,
// optimizer, schedule, clipping, gradient accumulation).
//
//   tessera launch --nproc-per-node 2 -- train_gpt --config configs/zero2_bf16.json --steps 200
//
// Flags: --config FILE (required), --steps N optimizer steps (required), --seed S (1234),
//        --eval-every K (0: never) validation loss every K steps.
//
// Every rank builds the model from the same seed and draws the same GLOBAL batch for each
// optimizer step, train_batch_size = micro_batch × gradient_accumulation_steps × data-parallel size
// sequences; micro-step m uses its rows [m·dp·micro, (m+1)·dp·micro), of which this rank trains on
// its own `micro`. So the data, and in exact arithmetic the whole run, depend only on
// train_batch_size, not on how it is split over ranks and accumulation steps. At the end rank 0
// prints `final loss: <value>`: the last optimizer step's loss (mean over its micro-steps),
// averaged over the data-parallel ranks. Just before it, rank 0 prints every rank's peak resident
// set size (getrusage's ru_maxrss, the whole process), for bench/run_engine_vs_ddp.sh:
//   peak rss per rank (bytes): 412381184 409845760
#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>

#include <cstdio>
#include <optional>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "csrc/process_exit.h"
#include "engine/config/config_io.h"
#include "engine/engine.h"
#include "engine/estimator/estimator.h"  // setup_from_config: does the config checkpoint
#include "engine/planner/auto_layout.h"
#include "engine/progress.h"  // peak_rss_bytes
#include "examples/data/fortunes_corpus.h"
#include "examples/models/gpt.h"
#include "examples/models/gpt_stage.h"
#include "parallel/pipeline/measured_costs.h"
#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/simulator.h"
#include "examples/train_args.h"
#include "parallel/context_parallel/layout.h"
#include "parallel/parallel_context.h"

using namespace tessera;
using namespace tessera::examples;

namespace {

int train_pipelined(const TrainArgs& args, Config config, ParallelContext& ctx, Gpt& model, const FortunesCorpus& corpus,
                    PartitionedInit* init);

constexpr int64_t kEvalBatches = 16;  // fixed validation batches (the same at every evaluation)

const char* kUsage = "usage: train_gpt --config FILE --steps N [--seed S] [--eval-every K] [--checkpoint-activations] [--save-parameters FILE] [--save DIR] [--load DIR]\n"
                     "                 [--n-layer L] [--n-head H] [--n-embd C] [--seq-len T] [--timeline FILE]";

// context_parallel.size > 1: this rank's part of every sequence (the method's layout).
Batch context_part(const Batch& b, const Config& config, ParallelContext& ctx) {
  if (ctx.context().size() == 1) return b;
  const ContextLayout layout = context_layout(config.context_parallel.method, ctx.context().size(), ctx.context().rank());
  return Batch{context_shard(b.inputs, 1, layout), context_shard(b.targets, 1, layout)};
}

double validation_loss(Gpt& model, const FortunesCorpus& corpus, ParallelContext& ctx, const Config& config,
                       int64_t micro, uint64_t seed) {
  at::NoGradGuard no_grad;
  const int64_t dp = ctx.data().size(), me = ctx.coordinates().data;
  double sum = 0;
  for (int64_t i = 0; i < kEvalBatches; ++i) {
    Batch global = corpus.sample(micro * dp, model.config().block_size, i, seed, FortunesCorpus::Split::Validation);
    Batch mine = context_part(rows(global, me * micro, micro), config, ctx);
    sum += model.loss(mine.inputs, mine.targets).item<double>();
  }
  return data_parallel_mean(ctx, sum / kEvalBatches);
}

// The config's "moe" section as the model's MoE blocks; the expert-parallel groups carved out of
// the data axis: adjacent data ranks exchange tokens ("ep_size_N"), ranks ep_size apart hold the
// same experts and average their gradients ("ep_size_N_data"), as tessera.moe makes them.
GptMoe moe_of(const Config& config, ParallelContext& ctx) {
  GptMoe moe;
  moe.config = config.moe;
  if (!moe.config) return moe;
  const MoeConfig& m = *moe.config;
  if (m.ep_size > 1) {
    const std::string name = "ep_size_" + std::to_string(m.ep_size);
    ctx.split_axis("data", {{name + "_data", -1}, {name, static_cast<int>(m.ep_size)}});
    moe.expert_parallel = &ctx.group_over(name);
    moe.expert_data = name + "_data";
  }
  return moe;
}

int run(int argc, char** argv) {
  TrainArgs args = parse_train_args(argc, argv, kUsage);

  // The world size comes from the environment before any connection: the config needs it to
  // resolve the parallel degrees and the batch triple.
  const RendezvousInfo info = rendezvous_info_from_environment();
  ResolvedLayout layout;
  std::vector<std::string> warnings;
  GptConfig sizes;
  if (args.n_layer) sizes.n_layer = args.n_layer;
  if (args.n_head) sizes.n_head = args.n_head;
  if (args.n_embd) sizes.n_embd = args.n_embd;
  if (args.seq_len) sizes.block_size = args.seq_len;
  // "auto" layout keys: the planner chooses them for this world and this model (every rank alike).
  std::string config_text = args.config;
  std::string auto_line;
  {
    ConfigReport report;
    const ConfigSource source = config_source(args.config);
    auto parsed = parse_json_text(source.inline_json ? args.config : read_text_file(args.config), source.name, report);
    if (parsed && planner::has_auto_layout(*parsed)) {
      const nlohmann::json model = {{"layers", sizes.n_layer}, {"hidden", sizes.n_embd}, {"heads", sizes.n_head},
                                    {"vocab", sizes.vocab}, {"seq_len", sizes.block_size},
                                    {"max_positions", sizes.block_size}, {"device", "cpu"}};
      const planner::AutoLayout resolved = planner::resolve_auto_layout(*parsed, info.world_size, model);
      config_text = resolved.config.dump();
      auto_line = resolved.line;
    }
  }
  Config config = load_config(config_text, info.world_size, &layout, &warnings);
  ParallelOptions options;
  options.tensor = layout.tensor;
  options.pipe = layout.pipe;
  options.context = layout.context;
  auto ctx = ParallelContext::from_environment(options);
  const bool leader = ctx->rank() == 0;
  if (leader)
    for (const auto& w : warnings) std::fprintf(stderr, "train_gpt: warning: %s\n", w.c_str());
  if (leader && !auto_line.empty()) std::printf("%s\n", auto_line.c_str());

  const int64_t micro = config.train_micro_batch_size_per_gpu.value_or(1);
  const int64_t accumulation = config.gradient_accumulation_steps.value_or(1);
  const int64_t dp = ctx->data().size();
  const int64_t rank = ctx->coordinates().data;  // this rank's place on the data-parallel axis
  const double weight_decay = config.optimizer ? config.optimizer->params.weight_decay : 0.0;

  FortunesCorpus corpus;
  // ZeRO-3: the model is built partitioned (DeepSpeed's zero.Init): no rank ever holds all of it.
  std::optional<PartitionedInit> init;
  if (config.zero_optimization.stage == 3) init.emplace(ctx->replicas());
  // tensor_parallel.tp_size > 1: the model is built split over the tensor group (each rank its slices).
  GptTensorParallel tp;
  if (ctx->tensor().size() > 1) tp = {&ctx->tensor(), config.tensor_parallel.sequence_parallel};
  // context_parallel.size > 1: each rank holds a part of every sequence, attention across the group.
  GptContextParallel cp;
  if (ctx->context().size() > 1) cp = {&ctx->context(), config.context_parallel.method};
  Gpt model(sizes, args.seed, init ? &*init : nullptr, tp, moe_of(config, *ctx), cp);
  // --checkpoint-activations, or a config that asks for it (pipeline.activation_checkpoint_interval,
  // or an activation_checkpointing section: the estimator's rule, so what the planner writes runs).
  args.checkpoint_activations = args.checkpoint_activations || setup_from_config(config).activation_checkpointing != "none";
  if (args.checkpoint_activations && config.pipeline.stages > 1 &&
      (config.pipeline.schedule == "zb_h1" || config.pipeline.schedule == "zb_v"))
    throw std::invalid_argument("--checkpoint-activations with pipeline.schedule \"" + config.pipeline.schedule +
                                "\": a recomputed block computes its weights' gradients with its input's, which a "
                                "zero-bubble schedule splits; use \"1f1b\" or \"interleaved_1f1b\" with checkpointing");
  if (args.checkpoint_activations) {
    // partition_activations splits the kept inputs over the tensor group, unless sequence
    // parallelism split them already (they then differ by tensor rank).
    const ActivationCheckpointingConfig a = config.activation_checkpointing.value_or(ActivationCheckpointingConfig{});
    CheckpointOptions options;
    if (a.partition_activations && tp.tensor && !tp.sequence_parallel) options.partition_over = tp.tensor;
    options.cpu = a.cpu_checkpointing;
    model.set_activation_checkpointing(options);
  }
  const int64_t seq_len = model.config().block_size;
  if (leader) {
    const GptConfig& g = model.config();
    std::printf("train_gpt: %s\n", ctx->describe().c_str());
    std::printf("train_gpt: GPT %lld parameters (%lld layers, %lld heads, %lld dims, block %lld, tied head); "
                "fortunes corpus %lld bytes (%lld held out)\n",
                (long long)model.num_parameters(), (long long)g.n_layer, (long long)g.n_head, (long long)g.n_embd,
                (long long)g.block_size, (long long)corpus.size(), (long long)corpus.validation_size());
    std::printf("train_gpt: %lld steps of %lld sequences (%lld per rank x %lld micro-steps x %lld data-parallel ranks)\n",
                (long long)args.steps, (long long)(micro * accumulation * dp), (long long)micro,
                (long long)accumulation, (long long)dp);
    if (args.checkpoint_activations) std::printf("train_gpt: activation checkpointing: every block recomputed in the backward\n");
    std::fflush(stdout);
  }

  if (ctx->pipe().size() > 1) return train_pipelined(args, std::move(config), *ctx, model, corpus, init ? &*init : nullptr);

  ModelDescription description = model.param_groups(weight_decay);
  if (init) init->take_shards(description);  // the engine builds its buffers from the chunks
  Engine engine(config, *ctx, std::move(description));
  model.attach(&engine);  // the forward reports its units (embedding, blocks, head) to the engine
  // --load: the training state of the latest checkpoint; the data position is its global step
  // (each step's batch is a function of the step alone). checkpoint.auto_resume loaded it already.
  int64_t first_step = engine.global_step();
  if (!args.load.empty()) {
    LoadOptions load;
    load.load_dir = args.load;
    const LoadResult loaded = engine.load_checkpoint(load);
    first_step = engine.global_step();
    if (leader) std::printf("train_gpt: resumed from %s at step %lld\n", loaded.path.c_str(), (long long)first_step);
  }

  double last_loss = 0;
  for (int64_t step = first_step; step < args.steps; ++step) {
    double step_loss = 0;
    // The step's global batch; micro-step m is its rows [m·dp·micro, (m+1)·dp·micro), and this
    // rank takes its `micro` rows of those.
    const Batch global = corpus.sample(micro * dp * accumulation, seq_len, step, args.seed);
    for (int64_t m = 0; m < accumulation; ++m) {
      const Batch mine = context_part(rows(global, (m * dp + rank) * micro, micro), config, *ctx);
      at::Tensor loss = model.loss(mine.inputs, mine.targets);
      engine.record_batch(micro, mine.inputs.numel());
      if (config.moe) engine.record_moe(model.last_aux_loss(), model.last_routed(), model.last_dropped());
      engine.backward(loss);
      engine.step();
      step_loss += loss.item<double>();
    }
    last_loss = step_loss / static_cast<double>(accumulation);

    if (args.eval_every > 0 && ((step + 1) % args.eval_every == 0 || step + 1 == args.steps)) {
      const double train = data_parallel_mean(*ctx, last_loss);
      const double val = validation_loss(model, corpus, *ctx, config, micro, args.seed);
      if (leader) {
        std::printf("step %lld: train loss %.4f, validation loss %.4f\n", (long long)(step + 1), train, val);
        std::fflush(stdout);
      }
    }
  }

  // Every data-parallel rank's peak RSS, gathered to rank 0 (they differ at ZeRO 1/2).
  // (Context-parallel ranks too: each holds a part of the activations.)
  const int64_t replicas = ctx->replicas().size();
  at::Tensor my_rss = at::full({1}, peak_rss_bytes(), at::kLong);
  at::Tensor all_rss = at::empty({replicas}, at::kLong);
  ctx->replicas().all_gather(my_rss, all_rss);
  if (leader) {
    std::printf("peak rss per rank (bytes):");
    for (int64_t r = 0; r < replicas; ++r) std::printf(" %lld", (long long)all_rss[r].item<int64_t>());
    std::printf("\n");
  }

  const double final_loss = data_parallel_mean(*ctx, last_loss);
  if (leader) std::printf("final loss: %.6f\n", final_loss);
  if (leader && ctx->context().size() > 1) {  // what context parallelism's collectives cost (bench/run_context_parallel.sh)
    for (const auto& [name, s] : ctx->context().stats())
      std::printf("context group %s: %lld calls, %.3f MB sent, %.3f s from call to wait's return, %.3f s blocked in "
                  "wait, over %lld steps\n",
                  name.c_str(), (long long)s.calls, s.sent_bytes / 1e6, s.seconds, s.blocked_seconds,
                  (long long)(args.steps - first_step));
  }
  if (leader) {  // rank 0's engine buffers (the estimator's validation reads them)
    const MemoryReport m = engine.memory();
    std::printf("engine memory (bytes): params %lld master %lld grads %lld states %lld\n", (long long)m.parameters,
                (long long)m.master_parameters, (long long)m.gradients, (long long)m.optimizer_states);
  }
  if (!args.save.empty()) {
    SaveOptions save;
    save.save_dir = args.save;
    const std::string path = engine.save_checkpoint(save);
    if (leader) std::printf("train_gpt: saved %s\n", path.c_str());
  }
  if (!args.save_parameters.empty()) {
    auto whole = engine.gathered_parameters();                     // ZeRO-3's partitions made whole
    std::vector<at::Tensor> values = model.full_parameters();      // and the tensor-parallel slices
    if (leader) write_parameters(args.save_parameters, values);
  }
  return 0;
}

// The last batch as it ran beside the simulator timed with the costs read off it (measured_costs.h):
// activations held and idle fraction per stage (rank 0 prints them and the costs), and with
// `timeline` each stage's instructions with their times on one clock, one JSON object a line, in
// `timeline` (bench/plot_pipeline.py draws them).
void report_pipeline(PipelineEngine& engine, ParallelContext& ctx, const std::string& timeline) {
  const pipeline::BatchReport& report = engine.last_report();
  const int s = engine.stage(), stages = engine.stages();
  // The simulator's costs read off this batch: every stage's timeline gathered (times on the host's
  // clock, which the ranks of one host share: the send latency compares one stage's send with
  // another's receive), the stages' lists padded to the longest.
  const pipeline::Schedule& schedule = engine.schedule();
  size_t longest_list = 0;
  for (const auto& list : schedule.stage) longest_list = std::max(longest_list, list.size());
  const int64_t row = int64_t(2 * longest_list);
  at::Tensor times = at::zeros({row}, at::kDouble), all_times = at::empty({stages * row}, at::kDouble);
  for (size_t i = 0; i < report.timeline.size(); ++i) {
    times.data_ptr<double>()[2 * i] = report.began + report.timeline[i].start;
    times.data_ptr<double>()[2 * i + 1] = report.began + report.timeline[i].end;
  }
  ctx.pipe().all_gather(times, all_times);
  std::vector<std::vector<pipeline::TimedInstruction>> timelines(stages);
  for (int k = 0; k < stages; ++k)
    for (size_t i = 0; i < schedule.stage[k].size(); ++i) {
      const double* t = all_times.data_ptr<double>() + k * row + 2 * i;
      timelines[k].push_back({schedule.stage[k][i], t[0], t[1]});
    }
  const pipeline::MeasuredCosts measured = pipeline::measured_costs(schedule, timelines);
  const pipeline::Simulation sim = pipeline::simulate(schedule, measured.costs);
  // The same costs with their spread in this batch (the same on every rank: seeded).
  const pipeline::ExpectedIdle expected = pipeline::expected_idle(schedule, measured, timelines);
  // Each stage's idle over the stages' shared span (the simulator's definition; a stage's own report
  // is over its own span, shorter for a stage that ends early).
  const std::vector<double> idle = pipeline::measured_idle(timelines);
  const MemoryReport memory = engine.engine().memory();
  constexpr int kFields = 9;
  at::Tensor mine = at::tensor({double(report.peak_activations), double(sim.peak_activations[s]), report.idle_fraction(),
                                sim.idle_fraction[s], report.seconds, double(peak_rss_bytes()), double(memory.parameters),
                                double(memory.gathered_parameters), double(memory.gathered_parameters_peak)},
                               at::kDouble);
  at::Tensor all = at::empty({stages * kFields}, at::kDouble);
  ctx.pipe().all_gather(mine, all);
  if (ctx.rank() == 0)
    for (int k = 0; k < stages; ++k) {
      const double* v = all.data_ptr<double>() + kFields * k;
      std::printf("pipeline stage %d: held %d micro-batches (simulated %d); idle %.3f of the last batch (%.3f of "
                  "its own %.3f s; simulated with the batch's measured costs: %.3f; expected with their spread: %.3f, "
                  "%.3f-%.3f); peak rss %.0f MiB; parameters %.0f bytes held, gathered now %.0f, at most %.0f\n",
                  k, int(v[0]), int(v[1]), idle[k], v[2], v[4], v[3], expected.mean[k], expected.low[k], expected.high[k],
                  v[5] / 1048576.0, v[6], v[7], v[8]);
    }
  if (ctx.rank() == 0) {
    const pipeline::Costs& c = measured.costs;
    auto per_stage_ms = [](const std::vector<double>& costs) {
      std::string text;
      for (double r : costs) text += (text.empty() ? "" : "/") + std::to_string(1e3 * r).substr(0, 5);
      return text;
    };
    std::printf("pipeline costs read off the last batch: forward %.4f s, backward %.4f s (W %.2f of it), send latency "
                "%.2f ms (median of %d transfers), a receive per stage %s ms, posting a send per stage %s ms, load %.2f ms, "
                "step %.2f ms\n",
                c.forward, c.backward, c.weight_share, 1e3 * c.send, measured.timed_transfers,
                per_stage_ms(c.receive).c_str(), per_stage_ms(c.posting).c_str(), 1e3 * c.load, 1e3 * c.optimizer_step);
  }
  if (!timeline.empty() && ctx.rank() == 0) {
    // Every stage's lines, from the gathered timelines: one clock, from the first stage's start.
    double origin = timelines[0].front().start;
    for (const auto& list : timelines) origin = std::min(origin, list.front().start);
    std::string text;
    for (int k = 0; k < stages; ++k)
      for (const pipeline::TimedInstruction& t : timelines[k])
        text += "{\"stage\": " + std::to_string(k) + ", \"op\": \"" + pipeline::op_name(t.instruction.op) +
                "\", \"micro_batch\": " + std::to_string(t.instruction.micro_batch) +
                ", \"chunk\": " + std::to_string(t.instruction.chunk) + ", \"start\": " + std::to_string(t.start - origin) +
                ", \"end\": " + std::to_string(t.end - origin) + "}\n";
    std::FILE* f = std::fopen(timeline.c_str(), "w");
    if (!f) throw std::runtime_error("--timeline: cannot write " + timeline);
    std::fputs(text.c_str(), f);
    std::fclose(f);
    std::printf("pipeline timeline of the last batch: %s\n", timeline.c_str());
  }
}

// pipeline.stages > 1: this rank runs its stage of the GPT's layers (embedding, blocks, head, cut
// by pipeline.partition_method) through PipelineEngine; the tied wte is held by the first and the
// last stage, its gradients summed between them (under zb_v stage 0 holds both ends of the model).
int train_pipelined(const TrainArgs& args, Config config, ParallelContext& ctx, Gpt& model, const FortunesCorpus& corpus,
                    PartitionedInit* init) {
  const bool leader = ctx.rank() == 0;
  const int stages = ctx.pipe().size(), stage = ctx.pipe().rank();
  const int64_t micro = config.train_micro_batch_size_per_gpu.value_or(1);
  const int64_t accumulation = config.gradient_accumulation_steps.value_or(1);
  const int64_t dp = ctx.data().size(), rank = ctx.coordinates().data;
  const int64_t seq_len = model.config().block_size;
  const double weight_decay = config.optimizer ? config.optimizer->params.weight_decay : 0.0;
  // stages·v model chunks (v = pipeline.virtual_stages); this rank holds chunks stage, stage + stages, ...
  // (zb_v: stage and 2·stages − 1 − stage).
  const pipeline::Placement placement = pipeline::placement_of(config.pipeline.schedule);
  const std::vector<int> bounds = pipeline::partition_chunks(model.layer_infos(), stages, config.pipeline.virtual_stages,
                                                             config.pipeline.partition_method);
  if (leader) {
    std::printf("train_gpt: %d pipeline stages (%s, %s schedule, %lld micro-batches):\n%s", stages,
                config.pipeline.partition_method.c_str(), config.pipeline.schedule.c_str(), (long long)accumulation,
                pipeline::describe_partition(model.layer_infos(), bounds, stages, placement).c_str());
    std::fflush(stdout);
  }
  const Gpt::LayerRanges chunks = pipeline::stage_layer_ranges(bounds, stage, stages, placement);
  model.keep_only_layers(chunks);  // the other stages' parameters are freed
  GptStage stage_model(model, chunks);
  // The embedding is on stage 0 and the head on the loss's stage (the last; stage 0 too under zb_v):
  // where those differ, the tied wte is in a group of its own on both.
  const int loss_stage = pipeline::ChunkLayout{stages, config.pipeline.virtual_stages, placement}.last_stage();
  const bool tied_across = loss_stage != 0 && (stage == 0 || stage == loss_stage);
  ModelDescription params = model.stage_param_groups(weight_decay, chunks, tied_across);
  std::vector<TiedGroup> tied;
  if (tied_across) tied.push_back({static_cast<int>(params.groups.size()) - 1, {0, loss_stage}});
  if (init) init->take_shards(params);  // ZeRO-3: the stage's chunks, built partitioned over its data group
  PipelineEngine engine(std::move(config), ctx, stage_model, std::move(params), tied);
  int64_t first_step = engine.engine().global_step();  // checkpoint.auto_resume loaded it already
  if (!args.load.empty()) {  // --load: as without stages, each stage's engine reads its own parameters
    LoadOptions load;
    load.load_dir = args.load;
    const LoadResult loaded = engine.engine().load_checkpoint(load);
    first_step = engine.engine().global_step();
    if (leader) std::printf("train_gpt: resumed from %s at step %lld\n", loaded.path.c_str(), (long long)first_step);
  }

  double loss = 0;
  for (int64_t step = first_step; step < args.steps; ++step) {
    // The step's global batch, as without stages: micro-batch m is rows [m·dp·micro, (m+1)·dp·micro).
    const Batch global = corpus.sample(micro * dp * accumulation, seq_len, step, args.seed);
    int64_t m = 0;
    loss = engine.train_batch([&] {
      const Batch mine = context_part(rows(global, (m++ * dp + rank) * micro, micro), engine.engine().config(), ctx);
      return MicroBatch{mine.inputs, mine.targets};
    });
    if (args.eval_every > 0 && ((step + 1) % args.eval_every == 0 || step + 1 == args.steps)) {
      double val = 0;
      for (int64_t i = 0; i < kEvalBatches; i += accumulation) {  // gradient_accumulation_steps batches per call
        int64_t k = i;
        val += engine.eval_batch([&] {
          const Batch global_val = corpus.sample(micro * dp, seq_len, k++, args.seed, FortunesCorpus::Split::Validation);
          const Batch mine = context_part(rows(global_val, rank * micro, micro), engine.engine().config(), ctx);
          return MicroBatch{mine.inputs, mine.targets};
        });
      }
      val /= double((kEvalBatches + accumulation - 1) / accumulation);
      if (leader) {
        std::printf("step %lld: train loss %.4f, validation loss %.4f\n", (long long)(step + 1), loss, val);
        std::fflush(stdout);
      }
    }
  }
  if (leader) std::printf("final loss: %.6f\n", loss);
  if (!args.save.empty()) {
    SaveOptions save;
    save.save_dir = args.save;
    const std::string path = engine.engine().save_checkpoint(save);
    if (leader) std::printf("train_gpt: saved %s\n", path.c_str());
  }
  report_pipeline(engine, ctx, args.timeline);
  if (!args.save_parameters.empty()) {
    // Each stage's trained parameters, from its ranks to every stage (one flat broadcast per stage).
    auto gathered = engine.engine().gathered_parameters();  // ZeRO-3: the stage's partitions made whole
    std::vector<at::Tensor> whole = model.full_parameters();
    for (int s = 0; s < stages; ++s) {
      const std::vector<int64_t> owned = model.full_parameters_of_layers(pipeline::stage_layer_ranges(bounds, s, stages, placement));
      std::vector<at::Tensor> parts;
      for (int64_t i : owned) parts.push_back(whole[i].reshape({-1}).to(at::kFloat));
      at::Tensor flat = at::cat(parts).contiguous();
      ctx.pipe().broadcast(flat, s);
      int64_t at = 0;
      for (int64_t i : owned) {
        whole[i] = flat.narrow(0, at, whole[i].numel()).view(whole[i].sizes());
        at += whole[i].numel();
      }
    }
    if (leader) write_parameters(args.save_parameters, whole);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int status = 1;
  try {
    status = run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_gpt: %s\n", e.what());
  }
  tessera::exit_skipping_static_destructors(status);  // run()'s objects are gone; LibTorch's teardown is not needed
}
