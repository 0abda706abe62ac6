// tessera._C.checkpoint: the checkpoint files of engine/checkpoint/, for Python and its tests.
#include <torch/csrc/utils/pybind.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <tuple>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "engine/checkpoint/engine_checkpoint.h"
#include "engine/checkpoint/file_image.h"
#include "engine/checkpoint/import_writer.h"
#include "engine/checkpoint/safetensors.h"

namespace py = pybind11;

namespace tessera {

void bind_checkpoint(py::module& m) {
  py::module ckpt = m.def_submodule("checkpoint", "checkpoint files: safetensors read and written by the C++ side");
  py::register_exception<checkpoint::SafetensorsError>(ckpt, "SafetensorsError", PyExc_ValueError);
  // direct=True: as an asynchronous save writes its rank file (file_image.h: data at 4 KiB, O_DIRECT).
  ckpt.def("write_safetensors",
           [](const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
              const std::map<std::string, std::string>& metadata, bool direct) {
             py::gil_scoped_release release;
             if (direct) checkpoint::write_file_image(checkpoint::make_file_image(tensors, metadata, path), path);
             else checkpoint::write_safetensors(path, tensors, metadata);
           },
           py::arg("path"), py::arg("tensors"), py::arg("metadata") = std::map<std::string, std::string>{},
           py::arg("direct") = false);
  ckpt.def("read_safetensors",  // -> ({name: CPU tensor}, {metadata})
           [](const std::string& path) {
             checkpoint::SafetensorsReader reader(path);
             py::dict tensors;
             for (const auto& [name, record] : reader.tensors()) tensors[py::str(name)] = reader.read(name);
             return py::make_tuple(tensors, reader.metadata());
           },
           py::arg("path"));
  // A checkpoint from another framework's state (python/tessera/deepspeed_checkpoint.py).
  py::class_<checkpoint::ImportWriter>(ckpt, "ImportWriter")
      .def(py::init([](const std::string& save_dir, const std::string& tag, const std::string& layout_json) {
             const nlohmann::json l = nlohmann::json::parse(layout_json);
             checkpoint::Layout layout;
             layout.world_size = l.at("world_size");
             layout.data_parallel = l.at("data_parallel");
             layout.zero_stage = l.at("zero_stage");
             layout.optimizer = l.at("optimizer");
             layout.compute_dtype = l.at("compute_dtype");
             layout.states = l.at("states").get<std::vector<std::string>>();
             return std::make_unique<checkpoint::ImportWriter>(save_dir, tag, layout);
           }),
           py::arg("save_dir"), py::arg("tag"), py::arg("layout_json"))
      .def("add_file",  // pieces: [(name, whole shape, dtype, begin, [(state, 1-D tensor), ...]), ...]
           [](checkpoint::ImportWriter& w,
              const std::vector<std::tuple<std::string, std::vector<int64_t>, std::string, int64_t,
                                           std::vector<std::pair<std::string, at::Tensor>>>>& pieces) {
             std::vector<checkpoint::ImportedPiece> out;
             for (const auto& [name, shape, dtype, begin, states] : pieces) out.push_back({name, shape, dtype, begin, states});
             py::gil_scoped_release release;
             w.add_file(out);
           },
           py::arg("pieces"))
      .def("commit",
           [](checkpoint::ImportWriter& w, const std::string& engine_json, const std::string& client_state_json) {
             return w.commit(nlohmann::json::parse(engine_json), nlohmann::json::parse(client_state_json));
           },
           py::arg("engine_json"), py::arg("client_state_json"));
}

namespace {

template <class Handle>
void bind_calls(py::class_<Handle>& engine) {
  // client_state crosses as JSON text: python/tessera/engine.py encodes and decodes it.
  engine
      .def("save_checkpoint",
           [](Handle& e, const std::string& save_dir, const std::string& tag, const std::string& client_state,
              bool async_save, const std::string& hf_config) {
             SaveOptions o{save_dir, tag, client_state};
             o.async = async_save;  // or the config's checkpoint.async_save
             o.hf_config = hf_config;
             std::string path;
             blocking([&] { path = engine_of(e).save_checkpoint(o); });
             return path;
           },
           py::arg("save_dir"), py::arg("tag") = "", py::arg("client_state") = "{}", py::arg("async_save") = false,
           py::arg("hf_config") = "")
      .def("wait_for_checkpoint", [](Handle& e) { blocking([&] { engine_of(e).wait_for_checkpoint(); }); })
      .def("checkpoint_host_bytes", [](Handle& e) { return engine_of(e).checkpoint_host_bytes(); })
      .def("checkpoint_in_flight", [](Handle& e) { return engine_of(e).checkpoint_in_flight(); })
      .def("load_checkpoint",  // -> (path, client_state JSON)
           [](Handle& e, const std::string& load_dir, const std::string& tag, bool load_optimizer_states,
              bool load_lr_scheduler_states, bool load_module_only, bool load_module_strict) {
             LoadOptions o;
             o.load_dir = load_dir;
             o.tag = tag;
             o.load_optimizer_states = load_optimizer_states;
             o.load_lr_scheduler_states = load_lr_scheduler_states;
             o.load_module_only = load_module_only;
             o.load_module_strict = load_module_strict;
             LoadResult r;
             blocking([&] { r = engine_of(e).load_checkpoint(o); });
             return py::make_tuple(r.path, r.client_state);
           },
           py::arg("load_dir"), py::arg("tag") = "", py::arg("load_optimizer_states") = true,
           py::arg("load_lr_scheduler_states") = true, py::arg("load_module_only") = false,
           py::arg("load_module_strict") = true)
      .def("resumed",  // checkpoint.auto_resume's load at construction: (path, client_state JSON) or None
           [](Handle& e) -> py::object {
             const auto& r = engine_of(e).resumed();
             if (!r) return py::none();
             return py::make_tuple(r->path, r->client_state);
           })
      .def("save_16bit_model",
           [](Handle& e, const std::string& save_dir, const std::string& save_filename) {
             std::string path;
             blocking([&] { path = engine_of(e).save_16bit_model(save_dir, save_filename); });
             return path;
           },
           py::arg("save_dir"), py::arg("save_filename") = "model.safetensors");
}

}  // namespace

void bind_engine_checkpoint(py::class_<EngineHandle>& engine) { bind_calls(engine); }
void bind_engine_checkpoint(py::class_<PipelineHandle>& engine) { bind_calls(engine); }

}  // namespace tessera
