// tessera._C: tessera.zero.Init's PartitionedInit and the Engine (engine/engine.h).
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "handles.h"

#include "client_optimizer.h"
#include "engine_handle.h"
#include "engine/progress.h"

namespace py = pybind11;

namespace tessera {

void bind_engine(py::module& m) {
  py::class_<InitHandle, std::shared_ptr<InitHandle>>(m, "PartitionedInit")
      .def(py::init([](std::shared_ptr<ParallelContext> context) {
             if (!context) throw std::invalid_argument("tessera: no parallel context");
             auto h = std::make_shared<InitHandle>();
             h->context = context;
             h->init = std::make_unique<PartitionedInit>(context->replicas());  // ZeRO-3's group: data x context
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
             model.enters_units = true;  // tessera/engine.py's hooks enter every unit, the root's included
             // The tensors, for the hooks: copied before the chunks go in, so that the engine's
             // construction frees each chunk once its bucket is built (a copy holding them kept the
             // whole shard allocated until the engine had already trimmed the heap).
             const ModelDescription parameters = model;
             for (const auto& init : inits)  // a model built under tessera.zero.Init: its chunks
               if (init) init->init->take_shards(model);
             auto e = std::make_unique<EngineHandle>();
             e->context = context;
             {
               py::gil_scoped_release release;  // may run collectives
               e->engine = std::make_unique<Engine>(config.config, *context, std::move(model));
             }
             e->engine->disable_unit_flops_profiler();  // tessera/flops_profiler.py profiles the modules
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
      .def("group_memory", [](EngineHandle& e) {
        py::list out;
        for (const auto& g : e.engine->group_memory()) {
          py::dict d;
          d["first_parameter"] = g.first_parameter;
          d["communicator"] = g.communicator;
          d["ranks"] = g.ranks;
          d["numel"] = g.numel;
          d["shard_numel"] = g.shard_numel;
          d["state_bytes"] = g.state_bytes;
          out.append(d);
        }
        return out;
      })
      .def("record_moe", [](EngineHandle& e, double aux_loss, int64_t routed, int64_t dropped) {
        e.engine->record_moe(aux_loss, routed, dropped);
      })
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
      .def("speculation_counts", [](const EngineHandle& e) {  // offload_optimizer.super_offload
        const SpeculativeStep::Counts c = e.engine->speculation_counts();
        py::dict d;
        d["kept"] = c.committed;
        d["restored"] = c.rolled_back;
        d["chunks"] = c.chunks;
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
}

}  // namespace tessera
