// The only place that knows c10d's backend classes and how they differ between PyTorch versions.
// Everything else talks to a plain c10d::Backend through parallel/communicator.h.
#pragma once

#include <chrono>
#include <string>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace tessera {

enum class BackendKind { Gloo, Nccl };
const char* backend_name(BackendKind kind);

// Whether this build can create NCCL groups (CUDA LibTorch) and a GPU is present.
bool nccl_available();

// A backend over `store` for a group of `size` ranks in which this process is `rank`.
c10::intrusive_ptr<c10d::Backend> make_backend(BackendKind kind, const c10::intrusive_ptr<c10d::Store>& store,
                                               int rank, int size, std::chrono::milliseconds timeout);

// True when `e` says the backend lacks the collective (so a fallback may be used instead).
bool is_unsupported_collective(const std::exception& e);

}  // namespace tessera
