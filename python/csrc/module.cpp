// tessera._C: the C++ engine as seen from Python. The thin `tessera` package (python/tessera/)
// builds the user-facing API on top of this module; nothing here is meant to be called directly.
//
// Tensors cross the boundary as the same TensorImpl objects (torch's own pybind11 casters), so the
// engine's set_data re-points the module's own nn.Parameters into its flat buffers: no copies.
//
// The GIL is released around everything that may block or run autograd (rendezvous, engine
// construction, backward, step, collectives): the autograd engine's threads and Gloo's threads never
// need it (the engine's gradient hooks are C++), and a Python autograd Function in the model takes it
// itself. SIGINT meanwhile only sets Python's flag; KeyboardInterrupt is raised when the call
// returns (see docs/python.md, "Ctrl-C").
#include <torch/csrc/utils/pybind.h>

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "client_optimizer.h"
#include "engine_handle.h"
#include "csrc/cpu_block_cache.h"
#include "csrc/cpu_features.h"
#include "engine/config/config_io.h"
#include "engine/engine.h"
#include "engine/pipeline_engine.h"
#include "parallel/pipeline/partition.h"
#include "engine/estimator/estimator.h"
#include "engine/progress.h"
#include "parallel/parallel_context.h"
#include "parallel/tensor_parallel/cross_entropy.h"
#include "parallel/tensor_parallel/layers.h"
#include "parallel/tensor_parallel/regions.h"
#include "zero/partitioned_init.h"

namespace py = pybind11;
using namespace tessera;

namespace {

// A resolved Config, opaque to Python except for its effective JSON.
struct ConfigHandle {
  Config config;
  ResolvedLayout layout;
};

// A parameter group as Python passes it: (params, lr, weight_decay, name, names, tensor_sharded).
using GroupTuple = std::tuple<std::vector<at::Tensor>, std::optional<double>, std::optional<double>, std::string,
                              std::vector<std::string>, std::vector<bool>>;

ModelDescription description_of(const std::vector<GroupTuple>& groups) {
  ModelDescription model;
  for (const auto& [params, lr, weight_decay, name, names, tensor_sharded] : groups)
    model.groups.push_back(ParamGroup{params, lr, weight_decay, name, names, tensor_sharded, {}});
  return model;
}

// tessera.zero.Init's C++ half (zero/partitioned_init.h), with the context its communicator lives in.
struct InitHandle {
  std::shared_ptr<ParallelContext> context;
  std::unique_ptr<PartitionedInit> init;
};

ReduceOp reduce_op(const std::string& op) {
  if (op == "sum") return ReduceOp::Sum;
  if (op == "avg") return ReduceOp::Avg;
  if (op == "max") return ReduceOp::Max;
  if (op == "min") return ReduceOp::Min;
  throw std::invalid_argument("tessera: unknown reduce op '" + op + "' (expected sum, avg, max or min)");
}

Communicator& group_of(ParallelContext& c, const std::string& name) {
  if (name == "world") return c.world();
  if (name == "data") return c.data();
  if (name == "tensor") return c.tensor();
  if (name == "pipe") return c.pipe();
  if (name == "model") return c.model();
  throw std::invalid_argument("tessera: unknown group '" + name + "' (expected world, data, tensor, pipe or model)");
}

// A tensor handed to a collective must not be the Python tensor itself: c10d's work object keeps
// its tensors and may drop them on a Gloo thread after the collective returned. Dropping the last
// reference to a tensor that has a Python object takes the GIL, which at interpreter shutdown ends
// that thread mid-destructor (std::terminate). A detached alias (a new TensorImpl, no Python
// object) shares the storage, so the collective still works in place, with no copy.
at::Tensor c_only(const at::Tensor& t) { return t.detach(); }

py::dict rendezvous_dict(const RendezvousInfo& i) {
  py::dict d;
  d["rank"] = i.rank;
  d["world_size"] = i.world_size;
  d["local_rank"] = i.local_rank;
  d["local_world_size"] = i.local_world_size;
  d["master_addr"] = i.master_addr;
  d["master_port"] = i.master_port;
  d["source"] = i.source;
  d["timeout_s"] = i.timeout.count() / 1000.0;
  return d;
}

// A Python stage model (tessera.pipe.PipelineModule's local layers and loss) for PipelineEngine.
class PyStageModel : public PipelineStageModel {
 public:
  at::Tensor forward(const at::Tensor& input) override {
    PYBIND11_OVERRIDE_PURE(at::Tensor, PipelineStageModel, forward, input);
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

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "tessera's C++ engine (use the `tessera` package, not this module)";
  m.attr("torch_version") = TESSERA_TORCH_VERSION;  // the torch this module was built against
  // Large CPU blocks from mappings and a bounded cache from the first import on, so that a model
  // built after `import tessera` leaves no freed heap behind (csrc/cpu_block_cache.h).
  tessera::CpuBlockCache::install_from_environment();
  m.def("cpu_block_cache_stats", [] {
    py::dict d;
    if (const tessera::CpuBlockCache* c = tessera::CpuBlockCache::installed()) {
      const tessera::CpuBlockCacheStats s = c->stats();
      d["capacity_bytes"] = c->capacity_bytes();
      d["hits"] = s.hits;
      d["misses"] = s.misses;
      d["evictions"] = s.evictions;
      d["cached_bytes"] = s.cached_bytes;
      d["mapped_bytes"] = s.mapped_bytes;
      d["peak_in_use_bytes"] = c->peak_in_use_bytes();
    }
    return d;
  }, "The large-block CPU allocator's counters (empty when TESSERA_CPU_BLOCK_CACHE_MIB < 0).");
  m.def("cpu_block_cache_release", [] {
    if (tessera::CpuBlockCache* c = tessera::CpuBlockCache::installed()) c->release_cached();
  }, "Unmaps the large blocks the CPU allocator keeps cached (blocks in use stay).");

  // Errors. ConfigError carries every error of the config, each with its JSON path.
  py::register_exception<ConfigError>(m, "ConfigError", PyExc_ValueError);
  py::register_exception<RendezvousError>(m, "RendezvousError", PyExc_RuntimeError);
  py::register_exception<CommError>(m, "CommError", PyExc_RuntimeError);
  // torch's checks inside the engine (shape, dtype, device): the message without the C++ backtrace.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });

  m.def("cpu_has_fast_bf16", &cpu_has_fast_bf16,
        "Whether this CPU has bf16 arithmetic (AVX512_BF16 or AMX-BF16); without it bf16 runs ~11x slower "
        "than fp32 on the CPU. TESSERA_CPU_BF16=0/1 overrides.");
  m.def("rendezvous_info", [] { return rendezvous_dict(rendezvous_info_from_environment()); },
        "This process's rank, world size, local rank, ... from the environment (torchrun, SLURM, Open MPI, "
        "single process); connects to nothing.");

  py::class_<ConfigHandle, std::shared_ptr<ConfigHandle>>(m, "Config")
      .def("to_json", [](const ConfigHandle& c) { return config_to_json(c.config).dump(); },
           "The effective config, every default filled in, as JSON text.")
      .def_property_readonly("tensor", [](const ConfigHandle& c) { return c.layout.tensor; })
      .def_property_readonly("pipe", [](const ConfigHandle& c) { return c.layout.pipe; })
      .def_property_readonly("data", [](const ConfigHandle& c) { return c.layout.data; })
      .def_property_readonly("world_size", [](const ConfigHandle& c) { return c.layout.world_size; })
      .def_property_readonly("zero_stage", [](const ConfigHandle& c) { return c.config.zero_optimization.stage; })
      .def_property_readonly("sequence_parallel",
                             [](const ConfigHandle& c) { return c.config.tensor_parallel.sequence_parallel; });

  m.def(
      "load_config",
      [](const std::string& path_or_json, int world_size, std::optional<std::pair<std::string, double>> client) {
        auto c = std::make_shared<ConfigHandle>();
        std::vector<std::string> warnings;
        ParseOptions options;
        if (client) options.client_optimizer = ClientOptimizerInfo{client->first, client->second};
        c->config = load_config(path_or_json, world_size, &c->layout, &warnings, options);
        return std::make_tuple(c, warnings);
      },
      py::arg("path_or_json"), py::arg("world_size"), py::arg("client_optimizer") = py::none(),
      "Parses, checks and resolves a config file or JSON text; raises ConfigError listing every error. "
      "client_optimizer: (type, lr) of a script's own torch optimizer that stands for the optimizer "
      "section. Returns (config, warnings).");

  py::class_<ParallelContext, std::shared_ptr<ParallelContext>>(m, "ParallelContext")
      .def(py::init([](int tensor, int pipe, const std::string& backend, bool defer_axis_groups, bool store_may_exist,
                       double timeout_s, const std::string& device) {
             ParallelOptions o;
             o.tensor = tensor;
             o.pipe = pipe;
             o.backend = backend;
             o.device = device;
             o.defer_axis_groups = defer_axis_groups;
             RendezvousInfo info = rendezvous_info_from_environment();
             info.store_may_exist = store_may_exist;
             if (timeout_s > 0) info.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
             py::gil_scoped_release release;  // the rendezvous waits for every rank
             return std::make_shared<ParallelContext>(info, o);
           }),
           py::arg("tensor") = 1, py::arg("pipe") = 1, py::arg("backend") = "auto", py::arg("defer_axis_groups") = false,
           py::arg("store_may_exist") = false, py::arg("timeout_s") = 0.0, py::arg("device") = "auto")
      .def(
          "make_axis_groups",
          [](ParallelContext& c, int tensor, int pipe, const std::string& device) {
            py::gil_scoped_release release;  // every rank of each group connects
            c.make_axis_groups(tensor, pipe, device);
          },
          py::arg("tensor"), py::arg("pipe"), py::arg("device") = "")
      .def_property_readonly("axis_groups_made", &ParallelContext::axis_groups_made)
      .def_property_readonly("rank", &ParallelContext::rank)
      .def_property_readonly("world_size", &ParallelContext::world_size)
      .def_property_readonly("local_rank", &ParallelContext::local_rank)
      .def_property_readonly("local_world_size", &ParallelContext::local_world_size)
      .def_property_readonly("tensor", [](const ParallelContext& c) { return c.grid().tensor; })
      .def_property_readonly("pipe", [](const ParallelContext& c) { return c.grid().pipe; })
      .def_property_readonly("backend", [](const ParallelContext& c) { return std::string(backend_name(c.backend())); })
      .def_property_readonly("device", [](const ParallelContext& c) { return c.device().str(); },
                             "Where the groups' tensors live: \"cpu\" or \"cuda:N\" (NCCL; or Gloo staging through host memory).")
      .def_property_readonly("info", [](const ParallelContext& c) { return rendezvous_dict(c.rendezvous_info()); })
      .def("group_rank", [](ParallelContext& c, const std::string& g) { return group_of(c, g).rank(); })
      .def("group_size", [](ParallelContext& c, const std::string& g) { return group_of(c, g).size(); })
      .def("describe", &ParallelContext::describe)
      .def("stats",  // per collective: [calls, bytes, seconds, sent bytes] on that group since it was made or reset
           [](ParallelContext& c, const std::string& g, bool reset) {
             Communicator& comm = group_of(c, g);
             py::dict d;
             for (const auto& [name, s] : comm.stats()) d[py::str(name)] = py::make_tuple(s.calls, s.bytes, s.seconds, s.sent_bytes);
             if (reset) comm.reset_stats();
             return d;
           }, py::arg("group"), py::arg("reset") = false)
      .def(
          "barrier",
          [](ParallelContext& c, const std::string& g) {
            Communicator& comm = group_of(c, g);
            blocking([&] { comm.barrier(); });
          },
          py::arg("group") = "world")
      .def(
          "all_reduce",
          [](ParallelContext& c, at::Tensor tensor, const std::string& op, const std::string& g) {
            Communicator& comm = group_of(c, g);
            ReduceOp r = reduce_op(op);
            if (!tensor.is_contiguous())
              throw std::invalid_argument("tessera.comm.all_reduce: the tensor must be contiguous (it is reduced in place)");
            at::Tensor shared = c_only(tensor);
            blocking([&] { comm.all_reduce(shared, r); });
          },
          py::arg("tensor"), py::arg("op") = "sum", py::arg("group") = "world")
      .def(
          "broadcast",
          [](ParallelContext& c, at::Tensor tensor, int src, const std::string& g) {
            Communicator& comm = group_of(c, g);
            if (!tensor.is_contiguous())
              throw std::invalid_argument("tessera.comm.broadcast: the tensor must be contiguous (it is written in place)");
            at::Tensor shared = c_only(tensor);
            blocking([&] { comm.broadcast(shared, src); });
          },
          py::arg("tensor"), py::arg("src") = 0, py::arg("group") = "world");

  py::class_<InitHandle, std::shared_ptr<InitHandle>>(m, "PartitionedInit")
      .def(py::init([](std::shared_ptr<ParallelContext> context) {
             if (!context) throw std::invalid_argument("tessera: no parallel context");
             auto h = std::make_shared<InitHandle>();
             h->context = context;
             h->init = std::make_unique<PartitionedInit>(context->data());
             return h;
           }),
           py::arg("context"))
      .def("partition", [](InitHandle& h, const std::vector<at::Tensor>& params) { blocking([&] { h.init->partition(params); }); })
      .def("gather", [](InitHandle& h, const std::vector<at::Tensor>& params) { blocking([&] { h.init->gather(params); }); })
      .def("release", [](InitHandle& h, const std::vector<at::Tensor>& params, int root) {
        blocking([&] { h.init->release(params, root); });
      }, py::arg("params"), py::arg("root") = -1)
      .def("holds", [](const InitHandle& h, const at::Tensor& p) { return h.init->holds(p); })
      .def_property_readonly("held_bytes", [](const InitHandle& h) { return h.init->held_bytes(); })
      .def_property_readonly("held_parameters", [](const InitHandle& h) { return h.init->held_parameters(); });

  py::class_<EngineHandle> engine_class(m, "Engine");
  bind_engine_checkpoint(engine_class);  // save/load_checkpoint, save_16bit_model (checkpoint_bindings.cpp)
  engine_class
      .def(py::init([](const ConfigHandle& config, std::shared_ptr<ParallelContext> context,
                       const std::vector<GroupTuple>& groups,
                       const std::vector<std::pair<std::string, std::vector<at::Tensor>>>& units,
                       const std::vector<std::shared_ptr<InitHandle>>& inits, py::object client_optimizer) {
             if (!context) throw std::invalid_argument("tessera: no parallel context");
             ModelDescription model = description_of(groups);
             if (!client_optimizer.is_none()) model.client_optimizer = client_optimizer_factory(client_optimizer);
             for (const auto& [name, params] : units) model.units.push_back(ModelUnit{name, params});
             for (const auto& init : inits)  // a model built under tessera.zero.Init: its chunks
               if (init) init->init->take_shards(model);
             auto e = std::make_unique<EngineHandle>();
             e->context = context;
             const ModelDescription parameters = model;  // the tensors, for the hooks
             {
               py::gil_scoped_release release;  // may run collectives
               e->engine = std::make_unique<Engine>(config.config, *context, std::move(model));
             }
             e->hooks.record(parameters);
             return e;
           }),
           py::arg("config"), py::arg("context"), py::arg("groups"), py::arg("units"),
           py::arg("inits") = std::vector<std::shared_ptr<InitHandle>>{}, py::arg("client_optimizer") = py::none())
      .def(
          "backward",
          [](EngineHandle& e, const at::Tensor& loss) { blocking([&] { e.engine->backward(loss); }); },
          py::arg("loss"))
      .def("watch_model_output", [](EngineHandle& e, const at::Tensor& output) { e.engine->watch_model_output(output); },
           "loss.backward() then step(): the engine's backward begins when autograd reaches this output")
      .def("discard_unfinished_backward", [](EngineHandle& e) { blocking([&] { e.engine->discard_unfinished_backward(); }); })
      .def(
          "backward_outputs",
          [](EngineHandle& e, const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& grads) {
            blocking([&] { e.engine->backward(outputs, grads); });
          },
          py::arg("outputs"), py::arg("output_grads"))
      // Unit events (zero/units.h), from the module hooks python/tessera/engine.py installs.
      // At ZeRO-3 a unit's begin gathers its parameters (and its end may release them): collectives.
      .def("unit_forward_begin", [](EngineHandle& e, int unit) { blocking([&] { e.engine->units().forward_begin(unit); }); })
      .def("unit_forward_end", [](EngineHandle& e, int unit) { blocking([&] { e.engine->units().forward_end(unit); }); })
      .def("unit_output", [](EngineHandle& e, int unit, const at::Tensor& output) {
        watch_unit_output(e.engine->units(), unit, output);
      })
      .def("record_unit_trace", [](EngineHandle& e, bool on) { e.engine->units().record_trace(on); })
      .def("wait_for_parameters", [](EngineHandle& e) { blocking([&] { e.engine->wait_for_parameters(); }); })
      .def("fetch_parameter", [](EngineHandle& e, const at::Tensor& p) { blocking([&] { e.engine->fetch_parameter(p); }); })
      .def("end_of_forward", [](EngineHandle& e) { blocking([&] { e.engine->end_of_forward(); }); })
      .def("write_back_parameters", [](EngineHandle& e, int root) { blocking([&] { e.engine->write_back_parameters(root); }); })
      .def("gather_all_parameters", [](EngineHandle& e) { blocking([&] { e.engine->gather_all_parameters(); }); })
      .def("release_all_parameters", [](EngineHandle& e) { blocking([&] { e.engine->release_all_parameters(); }); })
      .def_property_readonly("parameters_in_flight", [](const EngineHandle& e) { return e.engine->parameters_in_flight(); })
      .def("unit_trace",
           [](EngineHandle& e) {
             py::list out;
             for (const auto& [unit, event] : e.engine->units().trace())
               out.append(py::make_tuple(unit, unit_event_name(event)));
             e.engine->units().clear_trace();
             return out;
           })
      .def("units",
           [](EngineHandle& e) {
             py::list out;
             const UnitTracker& t = e.engine->units();
             for (int u = 0; u < t.size(); ++u) {
               py::dict d;
               d["name"] = t.unit(u).name;
               d["params"] = t.unit(u).params;
               d["shared"] = t.unit(u).shared;
               d["numel"] = t.unit(u).owned_numel;
               d["forwards"] = t.stats()[u].forwards;
               d["backwards"] = t.stats()[u].backwards;
               d["forward_s"] = t.stats()[u].forward_s;
               d["backward_s"] = t.stats()[u].backward_s;
               out.append(d);
             }
             return out;
           })
      .def("step",
           [](EngineHandle& e) { blocking([&] { e.engine->step(); }); })
      .def("zero_grad", [](EngineHandle& e) { e.engine->zero_grad(); })
      .def("record_batch", [](EngineHandle& e, int64_t samples, int64_t tokens) { e.engine->record_batch(samples, tokens); },
           py::arg("samples"), py::arg("tokens") = 0)
      .def("is_gradient_accumulation_boundary",
           [](const EngineHandle& e) { return e.engine->is_gradient_accumulation_boundary(); })
      .def_property_readonly("global_step", [](const EngineHandle& e) { return e.engine->global_step(); })
      .def_property_readonly("micro_step", [](const EngineHandle& e) { return e.engine->micro_step(); })
      .def_property_readonly("skipped_steps", [](const EngineHandle& e) { return e.engine->skipped_steps(); })
      .def_property_readonly("learning_rate", [](const EngineHandle& e) { return e.engine->learning_rate(); })
      .def("set_group_learning_rates",
           [](EngineHandle& e, std::vector<double> lrs) { e.engine->set_group_learning_rates(std::move(lrs)); })
      .def_property_readonly("loss_scale", [](const EngineHandle& e) { return e.engine->loss_scale(); })
      .def_property_readonly("last_grad_norm", [](const EngineHandle& e) { return e.engine->last_grad_norm(); })
      .def_property_readonly("last_loss", [](const EngineHandle& e) { return e.engine->last_loss(); })
      .def_property_readonly("optimizer_phase", [](const EngineHandle& e) { return e.engine->optimizer_phase(); })
      .def("optimizer_state",  // name -> the tensor the optimizer updates in place (shared memory)
           [](const EngineHandle& e) {
             py::dict d;
             for (const auto& [name, t] : e.engine->optimizer_state()) d[py::str(name)] = t;
             return d;
           })
      .def_property_readonly("context", [](const EngineHandle& e) { return e.context; })
      .def("config_json", [](const EngineHandle& e) { return config_to_json(e.engine->config()).dump(); })
      .def("wall_clock_breakdown", [](const EngineHandle& e) {
        const StepTimes& t = e.engine->wall_clock_breakdown();
        py::dict d;
        d["forward_s"] = t.forward_s;
        d["backward_s"] = t.backward_s;
        d["reduce_wait_s"] = t.reduce_s;
        d["optimizer_s"] = t.optimizer_s;
        d["allgather_wait_s"] = t.allgather_s;
        d["optimizer_steps"] = t.optimizer_steps;
        return d;
      })
      .def("memory", [](const EngineHandle& e) {
        MemoryReport r = e.engine->memory();
        py::dict d;
        d["parameters"] = r.parameters;
        d["master_parameters"] = r.master_parameters;
        d["gradients"] = r.gradients;
        d["optimizer_states"] = r.optimizer_states;
        d["buckets"] = r.buckets;
        d["total"] = r.total();
        d["gathered_parameters"] = r.gathered_parameters;
        d["gathered_parameters_peak"] = r.gathered_parameters_peak;
        d["gathered_pool"] = r.gathered_pool;
        d["offloaded_optimizer_bytes"] = r.offloaded_optimizer_bytes;
        d["offloaded_parameter_bytes"] = r.offloaded_parameter_bytes;
        d["offload_read_bytes"] = r.offload_read_bytes;
        d["offload_written_bytes"] = r.offload_written_bytes;
        d["host_optimizer_bytes"] = r.host_optimizer_bytes;
        d["host_parameter_bytes"] = r.host_parameter_bytes;
        return d;
      });

  m.def("peak_rss_bytes", &peak_rss_bytes, "Peak resident set size of this process, in bytes.");

  // The memory estimator (engine/estimator/estimator.h): a JSON request with the CLI's flags as keys, a JSON
  // answer; tessera.estimate() wraps it.
  m.def(
      "estimate_json",
      [](const std::string& request) { return estimate_json(nlohmann::json::parse(request)).dump(); },
      py::arg("request"), "Memory estimate for a JSON request with `tessera estimate`'s flags as keys.");

  // Tensor parallelism (parallel/tensor_parallel/) on the context's tensor group; autograd-aware:
  // their backward runs the other side's collective. python/tessera/tensor_parallel.py wraps them.
  py::module tp = m.def_submodule("tensor_parallel", "Megatron-LM's region crossings and layers");
  using Region = at::Tensor (*)(const at::Tensor&, Communicator&);
  using RegionAlong = at::Tensor (*)(const at::Tensor&, Communicator&, int64_t);
  auto region = [&tp](const char* name, Region f) {
    tp.def(name, [f](const at::Tensor& x, ParallelContext& c) {
      at::Tensor y;
      blocking([&] { y = f(x, c.tensor()); });
      return y;
    }, py::arg("x"), py::arg("context"));
  };
  auto region_along = [&tp](const char* name, RegionAlong f) {
    tp.def(name, [f](const at::Tensor& x, ParallelContext& c, int64_t dim) {
      at::Tensor y;
      blocking([&] { y = f(x, c.tensor(), dim); });
      return y;
    }, py::arg("x"), py::arg("context"), py::arg("dim"));
  };
  region("copy_to_tensor_region", &copy_to_tensor_region);
  region("reduce_from_tensor_region", &reduce_from_tensor_region);
  region_along("gather_from_sequence_region", &gather_from_sequence_region);
  region_along("reduce_scatter_to_sequence_region", &reduce_scatter_to_sequence_region);
  region_along("scatter_to_sequence_region", &scatter_to_sequence_region);
  region_along("gather_from_tensor_region", &gather_from_tensor_region);
  auto bias_of = [](const std::optional<at::Tensor>& b) { return b ? *b : at::Tensor(); };
  tp.def("column_parallel_linear",
         [bias_of](const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b, ParallelContext& c,
                   bool sequence_parallel, int64_t seq_dim, bool gather_output) {
           at::Tensor y;
           blocking([&] { y = column_parallel_linear(x, w, bias_of(b), c.tensor(), {sequence_parallel, seq_dim}, gather_output); });
           return y;
         });
  tp.def("row_parallel_linear",
         [bias_of](const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b, ParallelContext& c,
                   bool sequence_parallel, int64_t seq_dim) {
           at::Tensor y;
           blocking([&] { y = row_parallel_linear(x, w, bias_of(b), c.tensor(), {sequence_parallel, seq_dim}); });
           return y;
         });
  tp.def("vocab_parallel_embedding",
         [](const at::Tensor& ids, const at::Tensor& w, int64_t vocab_start, ParallelContext& c, bool sequence_parallel,
            int64_t seq_dim) {
           at::Tensor y;
           blocking([&] { y = vocab_parallel_embedding(ids, w, vocab_start, c.tensor(), {sequence_parallel, seq_dim}); });
           return y;
         });
  tp.def("vocab_parallel_cross_entropy",
         [](const at::Tensor& logits, const at::Tensor& targets, ParallelContext& c, int64_t ignore_index) {
           at::Tensor y;
           blocking([&] { y = vocab_parallel_cross_entropy(logits, targets, c.tensor(), ignore_index); });
           return y;
         });
  tp.def("slice", &tensor_parallel_slice, py::arg("whole"), py::arg("rank"), py::arg("ranks"), py::arg("dim"),
         py::arg("fused") = 1, py::arg("what") = "a tensor");
  tp.def("whole", [](const at::Tensor& slice, ParallelContext& c, int64_t dim, int64_t fused) {
    at::Tensor y;
    blocking([&] { y = tensor_parallel_whole(slice, c.tensor(), dim, fused); });
    return y;
  }, py::arg("slice"), py::arg("context"), py::arg("dim"), py::arg("fused") = 1);

  bind_checkpoint(m);  // ---- checkpoint files: tessera._C.checkpoint (checkpoint_bindings.cpp) ----

  // ---- pipeline parallelism (engine/pipeline_engine.h, parallel/pipeline/) ----
  py::module pipe = m.def_submodule("pipeline", "pipeline stages: partitioning, PipelineEngine");
  pipe.def("partition",
           [](const std::vector<std::pair<std::string, int64_t>>& layers, int stages, const std::string& method) {
             return pipeline::partition_layers(layer_infos_of(layers), stages, method);
           },
           py::arg("layers"), py::arg("stages"), py::arg("method"));
  pipe.def("describe_partition", [](const std::vector<std::pair<std::string, int64_t>>& layers, const std::vector<int>& bounds) {
    return pipeline::describe_partition(layer_infos_of(layers), bounds);
  });
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
        d["losses"] = r.losses;
        return d;
      })
      .def("wait_for_parameters", [](PipelineHandle& h) { blocking([&] { h.engine->engine().wait_for_parameters(); }); });
}
