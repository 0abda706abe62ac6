// The Python Engine's C++ side, shared by the binding files (module.cpp, checkpoint_bindings.cpp).
#pragma once

#include <torch/csrc/utils/pybind.h>

#include <torch/csrc/autograd/variable.h>

#include <memory>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/pipeline_engine.h"
#include "parallel/communicator.h"
#include "parallel/parallel_context.h"

namespace tessera {

// The engine and the context it was built on (the engine holds a reference to the context, so the
// context must outlive it: members are destroyed in reverse order).
//
// The engine installs a post-accumulate-grad hook on every parameter that calls back into it. A
// Python module outlives its engine easily (`del engine`, then plain PyTorch on the model), so when
// the engine goes, the hooks it installed go too (unless a newer engine has replaced them): the
// parameters become ordinary leaf tensors again, still holding the last values (they keep the flat
// buffer's storage alive).
//
// The hooks an engine put on its parameters (recorded right after it was built), taken off again
// when the handle goes; declared after the engine, so taken off before it is destroyed.
struct GradHooks {
  std::vector<std::pair<at::Tensor, const void*>> hooks;  // a parameter, the hook the engine put on it

  void record(const ModelDescription& model) {
    for (const auto& g : model.groups)
      for (const auto& p : g.params)
        hooks.emplace_back(p, static_cast<const void*>(torch::autograd::impl::post_acc_grad_hooks(p).get()));
  }
  ~GradHooks() {
    for (auto& [param, hook] : hooks) {
      auto& slot = torch::autograd::impl::post_acc_grad_hooks(param);
      if (slot && static_cast<const void*>(slot.get()) == hook) slot.reset();
    }
  }
};

struct EngineHandle {
  std::shared_ptr<ParallelContext> context;
  std::unique_ptr<Engine> engine;
  GradHooks hooks;
};

// PipelineEngine (tessera.pipe) with what it runs on kept alive (the Python stage model), and its
// engine's gradient hooks (as EngineHandle).
struct PipelineHandle {
  std::shared_ptr<ParallelContext> context;
  pybind11::object model;  // the PyStageModel
  std::unique_ptr<PipelineEngine> engine;
  GradHooks hooks;
};

// The Engine under either handle (checkpoint_bindings.cpp binds the same calls on both).
inline Engine& engine_of(EngineHandle& h) { return *h.engine; }
inline Engine& engine_of(PipelineHandle& h) { return h.engine->engine(); }

// Runs a blocking engine call without the GIL. When a collective fails because a peer is gone and
// this process has a SIGINT pending (Ctrl-C reached every rank; a faster one already exited), the
// KeyboardInterrupt is what the user meant, so it is raised instead of the CommError.
template <class F>
inline void blocking(F&& f) {
  try {
    pybind11::gil_scoped_release release;
    f();
  } catch (const CommError&) {
    if (PyErr_CheckSignals() != 0) throw pybind11::error_already_set();
    throw;
  }
}


}  // namespace tessera
