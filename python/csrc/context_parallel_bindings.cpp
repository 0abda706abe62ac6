// tessera._C.context_parallel: context parallelism's pieces (parallel/context_parallel/), which
// python/tessera/sequence/ wraps: Ulysses's all-to-alls, ring attention, the sequence layouts and
// the loss over the whole sequence. Autograd-aware: the collectives run again in the backward.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <optional>
#include <string>

#include "bindings.h"
#include "parallel/communicator.h"
#include "parallel/context_parallel/layout.h"
#include "parallel/context_parallel/ring_attention.h"
#include "parallel/context_parallel/ulysses.h"
#include "parallel/parallel_context.h"

namespace py = pybind11;

namespace tessera {

namespace {

using Context = std::shared_ptr<ParallelContext>;

// `f(group)` on the context's group named `group`, without the GIL (every rank of it takes part).
template <class F>
at::Tensor on_group(const Context& c, const std::string& group, F f) {
  Communicator& g = c->group_over(group);
  at::Tensor out;
  blocking([&] { out = f(g); });
  return out;
}

}  // namespace

void bind_context_parallel(py::module& m) {
  py::module cp = m.def_submodule("context_parallel", "Ulysses, ring attention and sequence layouts (parallel/context_parallel/)");
  cp.def(
      "shard",
      [](const at::Tensor& x, int64_t dim, const std::string& method, int64_t ranks, int64_t rank) {
        return context_shard(x, dim, context_layout(method, ranks, rank));
      },
      py::arg("x"), py::arg("dim"), py::arg("method"), py::arg("ranks"), py::arg("rank"),
      "This rank's part of x along dim: contiguous for ulysses, chunks rank and 2N-1-rank of 2N for ring.");
  cp.def(
      "positions",
      [](int64_t length, const std::string& method, int64_t ranks, int64_t rank, const std::string& device) {
        return context_positions(length, context_layout(method, ranks, rank), c10::Device(device));
      },
      py::arg("length"), py::arg("method"), py::arg("ranks"), py::arg("rank"), py::arg("device") = "cpu");
  cp.def(
      "padding",
      [](int64_t length, const std::string& method, int64_t ranks) {
        return context_padding(length, context_layout(method, ranks, 0));
      },
      py::arg("length"), py::arg("method"), py::arg("ranks"));
  cp.def(
      "unshard",
      [](const at::Tensor& part, const Context& c, const std::string& group, int64_t dim, const std::string& method) {
        return on_group(c, group, [&](Communicator& g) {
          return context_unshard(part, g, dim, context_layout(method, g.size(), g.rank()));
        });
      },
      py::arg("part"), py::arg("context"), py::arg("group"), py::arg("dim"), py::arg("method"));
  cp.def(
      "mean",
      [](const at::Tensor& local_sum, const at::Tensor& local_count, const Context& c, const std::string& group) {
        return on_group(c, group, [&](Communicator& g) { return context_mean(local_sum, local_count, g); });
      },
      py::arg("local_sum"), py::arg("local_count"), py::arg("context"), py::arg("group") = "context");
  cp.def("check_ulysses_heads", &check_ulysses_heads, py::arg("heads"), py::arg("ranks"));
  cp.def(
      "sequence_to_heads",
      [](const at::Tensor& x, const Context& c, const std::string& group, int64_t seq_dim, int64_t head_dim) {
        return on_group(c, group, [&](Communicator& g) { return sequence_to_heads(x, g, seq_dim, head_dim); });
      },
      py::arg("x"), py::arg("context"), py::arg("group"), py::arg("seq_dim"), py::arg("head_dim"));
  cp.def(
      "heads_to_sequence",
      [](const at::Tensor& x, const Context& c, const std::string& group, int64_t seq_dim, int64_t head_dim) {
        return on_group(c, group, [&](Communicator& g) { return heads_to_sequence(x, g, seq_dim, head_dim); });
      },
      py::arg("x"), py::arg("context"), py::arg("group"), py::arg("seq_dim"), py::arg("head_dim"));
  cp.def(
      "ring_attention",
      [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Context& c, const std::string& group,
         bool causal, std::optional<double> scale, const std::string& kernel) {
        RingAttentionOptions o;
        o.causal = causal, o.scale = scale, o.kernel = kernel;
        return on_group(c, group, [&](Communicator& g) { return ring_attention(q, k, v, g, o); });
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("context"), py::arg("group") = "context",
      py::arg("causal") = true, py::arg("scale") = py::none(), py::arg("kernel") = "auto");
}

}  // namespace tessera
