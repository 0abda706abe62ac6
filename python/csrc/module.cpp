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
//
// Each concern is bound in a file of its own (bindings.h); this file makes the module, its errors,
// and calls them.
#include <torch/csrc/utils/pybind.h>

#include <c10/util/Exception.h>

#include "bindings.h"
#include "engine/config/config_io.h"
#include "parallel/communicator.h"
#include "parallel/rendezvous.h"

namespace py = pybind11;
using namespace tessera;

PYBIND11_MODULE(_C, m) {
  m.doc() = "tessera's C++ engine (use the `tessera` package, not this module)";
  m.attr("torch_version") = TESSERA_TORCH_VERSION;  // the torch this module was built against
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

  bind_runtime(m);          // the CPU allocator, CPU features, peak RSS (runtime_bindings.cpp)
  bind_config(m);           // Config, load_config, estimate_json (config_bindings.cpp)
  bind_parallel(m);         // rendezvous, ParallelContext, tensor_parallel (parallel_bindings.cpp)
  bind_engine(m);           // PartitionedInit, Engine (engine_bindings.cpp)
  bind_checkpoint(m);       // tessera._C.checkpoint (checkpoint_bindings.cpp)
  bind_moe(m);              // tessera._C.moe (moe_bindings.cpp)
  bind_context_parallel(m);  // tessera._C.context_parallel (context_parallel_bindings.cpp)
  bind_pipeline(m);         // tessera._C.pipeline (pipeline_bindings.cpp)
}
