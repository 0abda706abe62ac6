// The parts of tessera._C bound in files of their own; module.cpp calls each from PYBIND11_MODULE.
#pragma once

#include <pybind11/pybind11.h>

namespace tessera {

// tessera._C.checkpoint: safetensors files read and written by engine/checkpoint/ (checkpoint_bindings.cpp).
void bind_checkpoint(pybind11::module& m);

}  // namespace tessera
