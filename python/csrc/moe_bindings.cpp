// tessera._C.moe: the router and the dispatch of a Mixture-of-Experts layer (parallel/moe/), which
// python/tessera/moe/ wraps in DeepSpeed's MoE module. Autograd-aware: the dispatch's all-to-alls
// run the other way in the backward.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <string>

#include "bindings.h"
#include "parallel/communicator.h"
#include "parallel/moe/dispatch.h"
#include "parallel/moe/gating.h"
#include "parallel/parallel_context.h"

namespace py = pybind11;

namespace tessera {

void bind_moe(py::module& m) {
  py::module moe = m.def_submodule("moe", "Mixture-of-Experts routing and dispatch (parallel/moe/)");
  moe.def("expert_capacity", &expert_capacity, py::arg("tokens"), py::arg("experts"), py::arg("factor"),
          py::arg("min_capacity"));

  py::class_<Routing>(moe, "Routing")
      .def_readonly("tokens", &Routing::tokens)
      .def_readonly("experts", &Routing::experts)
      .def_readonly("k", &Routing::k)
      .def_readonly("capacity", &Routing::capacity)
      .def_readonly("expert", &Routing::expert)
      .def_readonly("slot", &Routing::slot)
      .def_readonly("kept", &Routing::kept)
      .def_readonly("weight", &Routing::weight)
      .def_readonly("l_aux", &Routing::l_aux)
      .def_readonly("exp_counts", &Routing::exp_counts)
      .def_readonly("dropped", &Routing::dropped);
  moe.def(
      "route",
      [](const at::Tensor& logits, int64_t k, double capacity_factor, int64_t min_capacity, bool drop_tokens,
         bool use_rts, bool second_expert_sampling, bool rsample, double z_loss_coef, bool training) {
        GateOptions o;
        o.k = k;
        o.capacity_factor = capacity_factor;
        o.min_capacity = min_capacity;
        o.drop_tokens = drop_tokens;
        o.use_rts = use_rts;
        o.second_expert_sampling = second_expert_sampling;
        o.rsample = rsample;
        o.z_loss_coef = z_loss_coef;
        return route(logits, o, training);
      },
      py::arg("logits"), py::arg("k") = 1, py::arg("capacity_factor") = 1.0, py::arg("min_capacity") = 4,
      py::arg("drop_tokens") = true, py::arg("use_rts") = true, py::arg("second_expert_sampling") = true,
      py::arg("rsample") = false, py::arg("z_loss_coef") = 0.0, py::arg("training") = true);

  // A Dispatch keeps the communicator it sends over: the ParallelContext it came from owns it for
  // the whole job, and the Python object keeps the context alive beside it.
  py::class_<Dispatch, std::shared_ptr<Dispatch>>(moe, "Dispatch")
      .def(py::init([](const at::Tensor& tokens, const Routing& routing, std::shared_ptr<ParallelContext> context,
                       const std::string& group) {
             Communicator* over = context != nullptr ? &context->group_over(group) : nullptr;
             std::shared_ptr<Dispatch> d;
             blocking([&] { d = std::make_shared<Dispatch>(tokens, routing, over); });
             return d;
           }),
           py::arg("tokens"), py::arg("routing"), py::arg("context") = nullptr, py::arg("group") = "")
      .def_property_readonly("local_experts", &Dispatch::local_experts)
      .def_property_readonly("first_expert", &Dispatch::first_expert)
      .def_property_readonly("rows_sent", &Dispatch::rows_sent)
      .def_property_readonly("expert_inputs", &Dispatch::expert_inputs)
      .def("combine", [](const Dispatch& d, const std::vector<at::Tensor>& outputs) {
        at::Tensor y;
        blocking([&] { y = d.combine(outputs); });
        return y;
      });
}

}  // namespace tessera
