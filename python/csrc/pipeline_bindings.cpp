// tessera._C.pipeline: layer partitioning and the PipelineEngine (engine/pipeline_engine.h, parallel/pipeline/).
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "handles.h"

#include <algorithm>
#include <tuple>

#include "engine_handle.h"
#include "parallel/pipeline/measured_costs.h"
#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/simulator.h"

namespace py = pybind11;

namespace tessera {
namespace {

// A Python stage model (tessera.pipe.PipelineModule's local layers and loss) for PipelineEngine.
class PyStageModel : public PipelineStageModel {
 public:
  at::Tensor forward(const at::Tensor& input) override {
    PYBIND11_OVERRIDE_PURE(at::Tensor, PipelineStageModel, forward, input);
  }
  at::Tensor forward(int chunk, const at::Tensor& input) override {
    PYBIND11_OVERRIDE_NAME(at::Tensor, PipelineStageModel, "forward_chunk", forward, chunk, input);
  }
  at::Tensor loss(const at::Tensor& output, const at::Tensor& labels) override {
    PYBIND11_OVERRIDE_PURE(at::Tensor, PipelineStageModel, loss, output, labels);
  }
};

std::vector<pipeline::LayerInfo> layer_infos_of(const std::vector<std::pair<std::string, int64_t>>& layers) {
  std::vector<pipeline::LayerInfo> infos;
  for (const auto& [type, params] : layers) infos.push_back({type, params});
  return infos;
}

// The data iterator's next() as a MicroBatchSource: it runs with the GIL, which train_batch's
// C++ (autograd, collectives) runs without.
MicroBatchSource source_of(const py::function& next) {
  return [next] {
    py::gil_scoped_acquire gil;
    py::tuple batch = next();
    if (batch.size() != 2) throw std::invalid_argument("tessera.pipe: the data iterator must yield (inputs, labels)");
    return MicroBatch{batch[0].cast<at::Tensor>(), batch[1].cast<at::Tensor>()};
  };
}

// An instruction's op by its name (op_name's), as last_report() gives it.
pipeline::Op op_of_name(const std::string& name) {
  for (int k = 0; k <= static_cast<int>(pipeline::Op::OptimizerStep); ++k)
    if (name == pipeline::op_name(static_cast<pipeline::Op>(k))) return static_cast<pipeline::Op>(k);
  throw std::invalid_argument("tessera.pipeline: no pipeline instruction is called \"" + name + "\"");
}

// Each stage's last_report()["timeline"]: (op, micro-batch, chunk, start, end) in its list's order.
using TimelineRows = std::vector<std::vector<std::tuple<std::string, int, int, double, double>>>;
std::vector<std::vector<pipeline::TimedInstruction>> timelines_of(const TimelineRows& rows) {
  std::vector<std::vector<pipeline::TimedInstruction>> timelines;
  for (const auto& stage : rows) {
    timelines.emplace_back();
    for (const auto& [op, mb, chunk, start, end] : stage) timelines.back().push_back({{op_of_name(op), mb, chunk}, start, end});
  }
  return timelines;
}

}  // namespace

void bind_pipeline(py::module& m) {
  py::module pipe = m.def_submodule("pipeline", "pipeline stages: partitioning, PipelineEngine");
  pipe.def("partition",
           [](const std::vector<std::pair<std::string, int64_t>>& layers, int stages, const std::string& method) {
             return pipeline::partition_layers(layer_infos_of(layers), stages, method);
           },
           py::arg("layers"), py::arg("stages"), py::arg("method"));
  pipe.def("partition_chunks",
           [](const std::vector<std::pair<std::string, int64_t>>& layers, int stages, int chunks, const std::string& method) {
             return pipeline::partition_chunks(layer_infos_of(layers), stages, chunks, method);
           },
           py::arg("layers"), py::arg("stages"), py::arg("chunks"), py::arg("method"));
  pipe.def("describe_partition",
           [](const std::vector<std::pair<std::string, int64_t>>& layers, const std::vector<int>& bounds, int stages,
              const std::string& placement) {
             return pipeline::describe_partition(layer_infos_of(layers), bounds, stages,
                                                 placement == "v" ? pipeline::Placement::V : pipeline::Placement::Loop);
           },
           py::arg("layers"), py::arg("bounds"), py::arg("stages") = 0, py::arg("placement") = "loop");
  // Where the model's stages·chunks chunks sit (parallel/pipeline/schedule.h ChunkLayout): per model
  // chunk its stage, and per stage its model chunks in local order.
  pipe.def("chunk_layout",
           [](int stages, int chunks, const std::string& placement) {
             if (placement != "loop" && placement != "v")
               throw std::invalid_argument("tessera.pipeline: placement must be \"loop\" or \"v\", got \"" + placement + "\"");
             const pipeline::ChunkLayout layout{stages, chunks,
                                                placement == "v" ? pipeline::Placement::V : pipeline::Placement::Loop};
             std::vector<int> stage_of;
             for (int g = 0; g < stages * chunks; ++g) stage_of.push_back(layout.place(g).first);
             std::vector<std::vector<int>> held(stages);
             for (int s = 0; s < stages; ++s)
               for (int c = 0; c < chunks; ++c) held[s].push_back(layout.model_chunk(s, c));
             py::dict d;
             d["stage_of"] = stage_of;
             d["chunks_of"] = held;
             d["loss_stage"] = layout.last_stage();
             return d;
           },
           py::arg("stages"), py::arg("chunks"), py::arg("placement") = "loop");
  // The simulator (parallel/pipeline/simulator.h) for a schedule by its config name: each stage's idle
  // fraction and peak activations with the given costs (a stage's forward, its whole backward, W's
  // share of it in split schedules, a transfer's latency, a load, the tied reduction, the step; or
  // `chunk_costs`, each stage's chunks' (F, B, W), in place of the first three; `receive`, what a
  // receive takes on each stage when its data is there; `posting`, what a send to another stage takes
  // each stage; `own`, each stage's instructions' own costs in its list's order: a batch replayed).
  pipe.def("simulate",
           [](const std::string& name, int stages, int micro_batches, int chunks, double forward, double backward,
              double weight_share, double send, double load, double reduce_tied, double optimizer_step,
              const std::vector<std::vector<std::tuple<double, double, double>>>& chunk_costs,
              const std::vector<double>& receive, const std::vector<double>& posting,
              const std::vector<std::vector<double>>& own) {
             pipeline::Costs costs;
             costs.receive = receive, costs.posting = posting, costs.own = own;
             costs.forward = forward, costs.backward = backward, costs.weight_share = weight_share;
             costs.send = send, costs.load = load, costs.reduce_tied = reduce_tied, costs.optimizer_step = optimizer_step;
             for (const auto& stage : chunk_costs) {
               costs.chunks.emplace_back();
               for (const auto& [f, b, w] : stage) costs.chunks.back().push_back({f, b, w});
             }
             const pipeline::Simulation sim = pipeline::simulate(pipeline::make_schedule(name, stages, micro_batches, chunks), costs);
             py::dict d;
             d["idle_fraction"] = sim.idle_fraction;
             d["peak_activations"] = sim.peak_activations;
             d["makespan"] = sim.makespan;
             py::list timeline;  // per stage: (op, micro-batch, chunk, start, end), as last_report()'s
             for (const auto& stage : sim.timeline) {
               py::list rows;
               for (const pipeline::TimedInstruction& t : stage)
                 rows.append(py::make_tuple(pipeline::op_name(t.instruction.op), t.instruction.micro_batch,
                                            t.instruction.chunk, t.start, t.end));
               timeline.append(rows);
             }
             d["timeline"] = timeline;
             return d;
           },
           py::arg("schedule"), py::arg("stages"), py::arg("micro_batches"), py::arg("chunks") = 1, py::arg("forward") = 1.0,
           py::arg("backward") = 2.0, py::arg("weight_share") = 0.5, py::arg("send") = 0.0, py::arg("load") = 0.0,
           py::arg("reduce_tied") = 0.0, py::arg("optimizer_step") = 0.0,
           py::arg("chunk_costs") = std::vector<std::vector<std::tuple<double, double, double>>>{},
           py::arg("receive") = std::vector<double>{}, py::arg("posting") = std::vector<double>{},
           py::arg("own") = std::vector<std::vector<double>>{});
  // The costs a measured batch ran with (parallel/pipeline/measured_costs.h), as simulate()'s keywords
  // (chunk_costs: each stage's chunks' (F, B, W)) plus timed_transfers: `timelines[s]` is stage s's
  // last_report()["timeline"], (op, micro-batch, chunk, start, end) in its list's order, the times on
  // one clock (plus its "began": the stages of one host share it).
  pipe.def("measured_costs",
           [](const std::string& name, int stages, int micro_batches, int chunks,
              const TimelineRows& rows) {
             const pipeline::Schedule schedule = pipeline::make_schedule(name, stages, micro_batches, chunks);
             const pipeline::MeasuredCosts measured = pipeline::measured_costs(schedule, timelines_of(rows));
             const pipeline::Costs& c = measured.costs;
             py::dict d;
             d["forward"] = c.forward, d["backward"] = c.backward, d["weight_share"] = c.weight_share, d["send"] = c.send;
             d["load"] = c.load, d["reduce_tied"] = c.reduce_tied, d["optimizer_step"] = c.optimizer_step;
             std::vector<std::vector<std::tuple<double, double, double>>> per_chunk;
             for (const auto& stage : c.chunks) {
               per_chunk.emplace_back();
               for (const pipeline::ChunkCosts& k : stage) per_chunk.back().emplace_back(k.forward, k.backward, k.weight);
             }
             d["chunk_costs"] = per_chunk;
             d["receive"] = c.receive;
             d["posting"] = c.posting;
             d["timed_transfers"] = measured.timed_transfers;
             return d;
           },
           py::arg("schedule"), py::arg("stages"), py::arg("micro_batches"), py::arg("chunks"), py::arg("timelines"));
  // The idle each stage can expect from a measured batch's costs with their spread
  // (measured_costs.h expected_idle): per stage the mean idle fraction over `draws` simulations and
  // its 10th and 90th percentiles; "replayed", the simulator's idle with each instruction's own cost
  // in the batch; "measured", the batch's own idle on the simulator's definition (over
  // the stages' shared span: measured_idle): `timelines` as measured_costs takes them.
  pipe.def("expected_idle",
           [](const std::string& name, int stages, int micro_batches, int chunks, const TimelineRows& rows, int draws,
              unsigned seed) {
             const pipeline::Schedule schedule = pipeline::make_schedule(name, stages, micro_batches, chunks);
             const std::vector<std::vector<pipeline::TimedInstruction>> timelines = timelines_of(rows);
             const pipeline::ExpectedIdle expected =
                 pipeline::expected_idle(schedule, pipeline::measured_costs(schedule, timelines), timelines, draws, seed);
             py::dict d;
             d["mean"] = expected.mean, d["low"] = expected.low, d["high"] = expected.high;
             d["replayed"] = expected.replayed;
             d["measured"] = pipeline::measured_idle(timelines);
             return d;
           },
           py::arg("schedule"), py::arg("stages"), py::arg("micro_batches"), py::arg("chunks"), py::arg("timelines"),
           py::arg("draws") = 200, py::arg("seed") = 0u);
  pipe.def("broadcast_between_stages",
           [](ParallelContext& c, at::Tensor& t, const std::vector<int>& stages, int root_stage) {
             blocking([&] {
               Communicator& g = c.pipe_stages(stages);
               const auto root = std::find(stages.begin(), stages.end(), root_stage) - stages.begin();
               g.broadcast(t, static_cast<int>(root));
             });
           },
           py::arg("context"), py::arg("tensor"), py::arg("stages"), py::arg("root_stage"));
  py::class_<PipelineStageModel, PyStageModel>(pipe, "StageModel").def(py::init<>());
  py::class_<PipelineHandle> pipe_engine_class(pipe, "Engine");
  bind_engine_checkpoint(pipe_engine_class);  // the same checkpoint calls on the stage's Engine
  pipe_engine_class
      .def(py::init([](const ConfigHandle& config, std::shared_ptr<ParallelContext> context, py::object model,
                       const std::vector<GroupTuple>& groups, const std::vector<std::pair<int, std::vector<int>>>& tied) {
             if (!context) throw std::invalid_argument("tessera: no parallel context");
             auto h = std::make_unique<PipelineHandle>();
             h->context = context;
             h->model = model;
             ModelDescription description = description_of(groups);
             const ModelDescription parameters = description;  // the tensors, for the hooks
             std::vector<TiedGroup> tied_groups;
             for (const auto& [group, stages] : tied) tied_groups.push_back({group, stages});
             {
               py::gil_scoped_release release;  // collectives
               h->engine = std::make_unique<PipelineEngine>(config.config, *context, model.cast<PipelineStageModel&>(),
                                                            std::move(description), std::move(tied_groups));
             }
             h->hooks.record(parameters);
             return h;
           }),
           py::arg("config"), py::arg("context"), py::arg("model"), py::arg("groups"), py::arg("tied"))
      // Without the GIL (autograd refuses to run under it); the stage model's forward and loss and
      // the data iterator take it back when the executor calls them.
      .def("train_batch", [](PipelineHandle& h, const py::function& next) {
        const MicroBatchSource source = source_of(next);
        double loss = 0;
        blocking([&] { loss = h.engine->train_batch(source); });
        return loss;
      })
      .def("eval_batch", [](PipelineHandle& h, const py::function& next) {
        const MicroBatchSource source = source_of(next);
        double loss = 0;
        blocking([&] { loss = h.engine->eval_batch(source); });
        return loss;
      })
      .def_property_readonly("stage", [](const PipelineHandle& h) { return h.engine->stage(); })
      .def_property_readonly("stages", [](const PipelineHandle& h) { return h.engine->stages(); })
      .def_property_readonly("global_step", [](PipelineHandle& h) { return h.engine->engine().global_step(); })
      .def_property_readonly("grad_norm", [](PipelineHandle& h) { return h.engine->engine().last_grad_norm(); })
      .def_property_readonly("learning_rate", [](PipelineHandle& h) { return h.engine->engine().learning_rate(); })
      .def_property_readonly("loss_scale", [](PipelineHandle& h) { return h.engine->engine().loss_scale(); })
      .def("last_report", [](const PipelineHandle& h) {
        const pipeline::BatchReport& r = h.engine->last_report();
        py::dict d;
        d["peak_activations"] = r.peak_activations;
        d["idle_fraction"] = r.idle_fraction();
        d["seconds"] = r.seconds;
        d["began"] = r.began;  // the host's monotonic clock (time.monotonic()), shared by its processes
        d["losses"] = r.losses;
        py::list timeline;  // (op, micro-batch, chunk, start, end): seconds since the batch began
        for (const pipeline::TimedInstruction& t : r.timeline)
          timeline.append(py::make_tuple(pipeline::op_name(t.instruction.op), t.instruction.micro_batch, t.instruction.chunk,
                                         t.start, t.end));
        d["timeline"] = timeline;
        return d;
      })
      .def("wait_for_parameters", [](PipelineHandle& h) { blocking([&] { h.engine->engine().wait_for_parameters(); }); })
      // ZeRO-3: the stage's partitioned parameters whole for a while (tessera.zero.GatheredParameters).
      .def("gather_all_parameters", [](PipelineHandle& h) { blocking([&] { h.engine->engine().gather_all_parameters(); }); })
      .def("release_all_parameters", [](PipelineHandle& h) { blocking([&] { h.engine->engine().release_all_parameters(); }); })
      .def("write_back_parameters",
           [](PipelineHandle& h, int root) { blocking([&] { h.engine->engine().write_back_parameters(root); }); });
}

}  // namespace tessera
