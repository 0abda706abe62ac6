// tessera._C: the config (engine/config/) and the memory estimator (engine/estimator/).
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "handles.h"

#include "engine/config/config_io.h"
#include "engine/estimator/estimator.h"
#include "engine/planner/auto_layout.h"
#include "engine/planner/planner.h"

namespace py = pybind11;

namespace tessera {

void bind_config(py::module& m) {
  py::class_<ConfigHandle, std::shared_ptr<ConfigHandle>>(m, "Config")
      .def("to_json", [](const ConfigHandle& c) { return config_to_json(c.config).dump(); },
           "The effective config, every default filled in, as JSON text.")
      .def_property_readonly("tensor", [](const ConfigHandle& c) { return c.layout.tensor; })
      .def_property_readonly("pipe", [](const ConfigHandle& c) { return c.layout.pipe; })
      .def_property_readonly("data", [](const ConfigHandle& c) { return c.layout.data; })
      .def_property_readonly("context", [](const ConfigHandle& c) { return c.layout.context; })
      .def_property_readonly("context_method", [](const ConfigHandle& c) { return c.config.context_parallel.method; })
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

  // The memory estimator (engine/estimator/estimator.h): a JSON request with the CLI's flags as keys, a JSON
  // answer; tessera.estimate() wraps it.
  m.def(
      "estimate_json",
      [](const std::string& request) { return estimate_json(nlohmann::json::parse(request)).dump(); },
      py::arg("request"), "Memory estimate for a JSON request with `tessera estimate`'s flags as keys.");

  // "auto" layout keys (engine/planner/auto_layout.h): the config text (a path or JSON text) with
  // them chosen, and the line that says what and why; text without them comes back unchanged.
  m.def(
      "resolve_auto_layout",
      [](const std::string& path_or_json, int world_size, const std::string& plan_request) {
        const ConfigSource source = config_source(path_or_json);
        ConfigReport report;
        const std::string text = source.inline_json ? path_or_json : read_text_file(path_or_json);
        auto parsed = parse_json_text(text, source.name, report);
        if (!parsed || !planner::has_auto_layout(*parsed)) return std::make_tuple(path_or_json, std::string());
        const planner::AutoLayout resolved =
            planner::resolve_auto_layout(*parsed, world_size, nlohmann::json::parse(plan_request));
        return std::make_tuple(resolved.config.dump(), resolved.line);
      },
      py::arg("path_or_json"), py::arg("world_size"), py::arg("plan_request") = "{}");

  // The layout planner (engine/planner/planner.h): the same kind of request, with global_batch; tessera.plan() wraps it.
  m.def(
      "plan_json",
      [](const std::string& request, int top) {
        py::gil_scoped_release release;  // the CPU probe times matrix products
        return planner::plan_json(nlohmann::json::parse(request), top).dump();
      },
      py::arg("request"), py::arg("top") = 5, "Layouts ranked by predicted step time for a JSON request with `tessera plan`'s flags as keys.");
}

}  // namespace tessera
