// tessera._C.checkpoint: the checkpoint files of engine/checkpoint/, for Python and its tests.
#include <torch/csrc/utils/pybind.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "engine/checkpoint/safetensors.h"

namespace py = pybind11;

namespace tessera {

void bind_checkpoint(py::module& m) {
  py::module ckpt = m.def_submodule("checkpoint", "checkpoint files: safetensors read and written by the C++ side");
  py::register_exception<checkpoint::SafetensorsError>(ckpt, "SafetensorsError", PyExc_ValueError);
  ckpt.def("write_safetensors",
           [](const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
              const std::map<std::string, std::string>& metadata) {
             py::gil_scoped_release release;
             checkpoint::write_safetensors(path, tensors, metadata);
           },
           py::arg("path"), py::arg("tensors"), py::arg("metadata") = std::map<std::string, std::string>{});
  ckpt.def("read_safetensors",  // -> ({name: CPU tensor}, {metadata})
           [](const std::string& path) {
             checkpoint::SafetensorsReader reader(path);
             py::dict tensors;
             for (const auto& [name, record] : reader.tensors()) tensors[py::str(name)] = reader.read(name);
             return py::make_tuple(tensors, reader.metadata());
           },
           py::arg("path"));
}

}  // namespace tessera
