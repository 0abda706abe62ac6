// The parts of tessera._C bound in files of their own; module.cpp calls each from PYBIND11_MODULE.
#pragma once

#include <pybind11/pybind11.h>

#include "engine_handle.h"

namespace tessera {

void bind_runtime(pybind11::module& m);
void bind_config(pybind11::module& m);
void bind_parallel(pybind11::module& m);
void bind_engine(pybind11::module& m);
void bind_pipeline(pybind11::module& m);
void bind_moe(pybind11::module& m);        // tessera._C.moe (moe_bindings.cpp)
void bind_context_parallel(pybind11::module& m);  // tessera._C.context_parallel (context_parallel_bindings.cpp)

// tessera._C.checkpoint: safetensors files read and written by engine/checkpoint/ (checkpoint_bindings.cpp).
void bind_checkpoint(pybind11::module& m);
// Engine.save_checkpoint, load_checkpoint, save_16bit_model (checkpoint_bindings.cpp).
void bind_engine_checkpoint(pybind11::class_<EngineHandle>& engine);
void bind_engine_checkpoint(pybind11::class_<PipelineHandle>& engine);

}  // namespace tessera
