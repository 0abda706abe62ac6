// tessera._C: the rendezvous, the ParallelContext and its collectives (parallel/), and tensor
// parallelism's regions and layers (parallel/tensor_parallel/), autograd-aware.
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "handles.h"

#include <chrono>

#include "parallel/tensor_parallel/cross_entropy.h"
#include "parallel/tensor_parallel/layers.h"
#include "parallel/tensor_parallel/regions.h"

namespace py = pybind11;

namespace tessera {
namespace {

ReduceOp reduce_op(const std::string& op) {
  if (op == "sum") return ReduceOp::Sum;
  if (op == "avg") return ReduceOp::Avg;
  if (op == "max") return ReduceOp::Max;
  if (op == "min") return ReduceOp::Min;
  throw std::invalid_argument("tessera: unknown reduce op '" + op + "' (expected sum, avg, max or min)");
}

Communicator& group_of(ParallelContext& c, const std::string& name) {
  if (name == "world") return c.world();
  if (name == "data") return c.data();
  if (name == "tensor") return c.tensor();
  if (name == "pipe") return c.pipe();
  if (name == "model") return c.model();
  return c.group_over(name);  // a factor split_axis made, or a product of axes ("data*tensor")
}

// A tensor handed to a collective must not be the Python tensor itself: c10d's work object keeps
// its tensors and may drop them on a Gloo thread after the collective returned. Dropping the last
// reference to a tensor that has a Python object takes the GIL, which at interpreter shutdown ends
// that thread mid-destructor (std::terminate). A detached alias (a new TensorImpl, no Python
// object) shares the storage, so the collective still works in place, with no copy.
at::Tensor c_only(const at::Tensor& t) { return t.detach(); }

py::dict rendezvous_dict(const RendezvousInfo& i) {
  py::dict d;
  d["rank"] = i.rank;
  d["world_size"] = i.world_size;
  d["local_rank"] = i.local_rank;
  d["local_world_size"] = i.local_world_size;
  d["master_addr"] = i.master_addr;
  d["master_port"] = i.master_port;
  d["source"] = i.source;
  d["timeout_s"] = i.timeout.count() / 1000.0;
  return d;
}

}  // namespace

void bind_parallel(py::module& m) {
  m.def("rendezvous_info", [] { return rendezvous_dict(rendezvous_info_from_environment()); },
        "This process's rank, world size, local rank, ... from the environment (torchrun, SLURM, Open MPI, "
        "single process); connects to nothing.");

  py::class_<ParallelContext, std::shared_ptr<ParallelContext>>(m, "ParallelContext")
      .def(py::init([](int tensor, int pipe, const std::string& backend, bool defer_axis_groups, bool store_may_exist,
                       double timeout_s, const std::string& device) {
             ParallelOptions o;
             o.tensor = tensor;
             o.pipe = pipe;
             o.backend = backend;
             o.device = device;
             o.defer_axis_groups = defer_axis_groups;
             RendezvousInfo info = rendezvous_info_from_environment();
             info.store_may_exist = store_may_exist;
             if (timeout_s > 0) info.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
             py::gil_scoped_release release;  // the rendezvous waits for every rank
             return std::make_shared<ParallelContext>(info, o);
           }),
           py::arg("tensor") = 1, py::arg("pipe") = 1, py::arg("backend") = "auto", py::arg("defer_axis_groups") = false,
           py::arg("store_may_exist") = false, py::arg("timeout_s") = 0.0, py::arg("device") = "auto")
      .def(
          "make_axis_groups",
          [](ParallelContext& c, int tensor, int pipe, const std::string& device, int context) {
            py::gil_scoped_release release;  // every rank of each group connects
            c.make_axis_groups(tensor, pipe, device, context);
          },
          py::arg("tensor"), py::arg("pipe"), py::arg("device") = "", py::arg("context") = 1)
      .def(
          "split_axis",
          [](ParallelContext& c, const std::string& axis, const std::vector<std::pair<std::string, int>>& factors) {
            c.split_axis(axis, factors);
          },
          py::arg("axis"), py::arg("factors"),
          "Splits a grid axis into named factors, outer to inner: split_axis(\"data\", [(\"expert_data\", 2), "
          "(\"expert\", 2)]). Every rank, after the axis groups exist; the factors' groups are made on first use.")
      .def_property_readonly("axis_groups_made", &ParallelContext::axis_groups_made)
      .def_property_readonly("rank", &ParallelContext::rank)
      .def_property_readonly("world_size", &ParallelContext::world_size)
      .def_property_readonly("local_rank", &ParallelContext::local_rank)
      .def_property_readonly("local_world_size", &ParallelContext::local_world_size)
      .def_property_readonly("tensor", [](const ParallelContext& c) { return c.grid().tensor; })
      .def_property_readonly("context_size", [](const ParallelContext& c) { return c.grid().context; })
      .def_property_readonly("pipe", [](const ParallelContext& c) { return c.grid().pipe; })
      .def_property_readonly("backend", [](const ParallelContext& c) { return std::string(backend_name(c.backend())); })
      .def_property_readonly("device", [](const ParallelContext& c) { return c.device().str(); },
                             "Where the groups' tensors live: \"cpu\" or \"cuda:N\" (NCCL; or Gloo staging through host memory).")
      .def_property_readonly("info", [](const ParallelContext& c) { return rendezvous_dict(c.rendezvous_info()); })
      .def("group_rank", [](ParallelContext& c, const std::string& g) { return group_of(c, g).rank(); })
      .def("group_size", [](ParallelContext& c, const std::string& g) { return group_of(c, g).size(); })
      .def("group_ranks", [](ParallelContext& c, const std::string& g) { return group_of(c, g).global_ranks(); })
      .def("describe", &ParallelContext::describe)
      .def("stats",  // per collective: [calls, bytes, seconds, sent bytes, blocked seconds] on that group since it
                     // was made or reset (parallel/communicator.h's CollectiveStats)
           [](ParallelContext& c, const std::string& g, bool reset) {
             Communicator& comm = group_of(c, g);
             py::dict d;
             for (const auto& [name, s] : comm.stats())
               d[py::str(name)] = py::make_tuple(s.calls, s.bytes, s.seconds, s.sent_bytes, s.blocked_seconds);
             if (reset) comm.reset_stats();
             return d;
           }, py::arg("group"), py::arg("reset") = false)
      .def("stats_by_size",  // [(group, its size, {(collective, message bytes): [calls, bytes, seconds, sent
                             // bytes, blocked seconds]})] for every group made so far (the comms logger)
           [](ParallelContext& c, bool reset) {
             py::list out;
             for (const auto& [name, comm] : c.communicators()) {
               py::dict d;
               for (const auto& [key, s] : comm->stats_by_size())
                 d[py::make_tuple(key.first, key.second)] =
                     py::make_tuple(s.calls, s.bytes, s.seconds, s.sent_bytes, s.blocked_seconds);
               if (reset) comm->reset_stats();
               out.append(py::make_tuple(name, comm->size(), d));
             }
             return out;
           }, py::arg("reset") = false)
      .def(
          "barrier",
          [](ParallelContext& c, const std::string& g) {
            Communicator& comm = group_of(c, g);
            blocking([&] { comm.barrier(); });
          },
          py::arg("group") = "world")
      .def(
          "all_reduce",
          [](ParallelContext& c, at::Tensor tensor, const std::string& op, const std::string& g) {
            Communicator& comm = group_of(c, g);
            ReduceOp r = reduce_op(op);
            if (!tensor.is_contiguous())
              throw std::invalid_argument("tessera.comm.all_reduce: the tensor must be contiguous (it is reduced in place)");
            at::Tensor shared = c_only(tensor);
            blocking([&] { comm.all_reduce(shared, r); });
          },
          py::arg("tensor"), py::arg("op") = "sum", py::arg("group") = "world")
      .def(
          "broadcast",
          [](ParallelContext& c, at::Tensor tensor, int src, const std::string& g) {
            Communicator& comm = group_of(c, g);
            if (!tensor.is_contiguous())
              throw std::invalid_argument("tessera.comm.broadcast: the tensor must be contiguous (it is written in place)");
            at::Tensor shared = c_only(tensor);
            blocking([&] { comm.broadcast(shared, src); });
          },
          py::arg("tensor"), py::arg("src") = 0, py::arg("group") = "world");

  // Tensor parallelism (parallel/tensor_parallel/) on the context's tensor group; autograd-aware:
  // their backward runs the other side's collective. python/tessera/tensor_parallel.py wraps them.
  py::module tp = m.def_submodule("tensor_parallel", "Megatron-LM's region crossings and layers");
  using Region = at::Tensor (*)(const at::Tensor&, Communicator&);
  using RegionAlong = at::Tensor (*)(const at::Tensor&, Communicator&, int64_t);
  auto region = [&tp](const char* name, Region f) {
    tp.def(name, [f](const at::Tensor& x, ParallelContext& c) {
      at::Tensor y;
      blocking([&] { y = f(x, c.tensor()); });
      return y;
    }, py::arg("x"), py::arg("context"));
  };
  auto region_along = [&tp](const char* name, RegionAlong f) {
    tp.def(name, [f](const at::Tensor& x, ParallelContext& c, int64_t dim) {
      at::Tensor y;
      blocking([&] { y = f(x, c.tensor(), dim); });
      return y;
    }, py::arg("x"), py::arg("context"), py::arg("dim"));
  };
  region("copy_to_tensor_region", &copy_to_tensor_region);
  region("reduce_from_tensor_region", &reduce_from_tensor_region);
  region_along("gather_from_sequence_region", &gather_from_sequence_region);
  region_along("reduce_scatter_to_sequence_region", &reduce_scatter_to_sequence_region);
  region_along("scatter_to_sequence_region", &scatter_to_sequence_region);
  region_along("gather_from_tensor_region", &gather_from_tensor_region);
  auto bias_of = [](const std::optional<at::Tensor>& b) { return b ? *b : at::Tensor(); };
  tp.def("column_parallel_linear",
         [bias_of](const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b, ParallelContext& c,
                   bool sequence_parallel, int64_t seq_dim, bool gather_output) {
           at::Tensor y;
           blocking([&] { y = column_parallel_linear(x, w, bias_of(b), c.tensor(), {sequence_parallel, seq_dim}, gather_output); });
           return y;
         });
  tp.def("row_parallel_linear",
         [bias_of](const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b, ParallelContext& c,
                   bool sequence_parallel, int64_t seq_dim) {
           at::Tensor y;
           blocking([&] { y = row_parallel_linear(x, w, bias_of(b), c.tensor(), {sequence_parallel, seq_dim}); });
           return y;
         });
  tp.def("vocab_parallel_embedding",
         [](const at::Tensor& ids, const at::Tensor& w, int64_t vocab_start, ParallelContext& c, bool sequence_parallel,
            int64_t seq_dim) {
           at::Tensor y;
           blocking([&] { y = vocab_parallel_embedding(ids, w, vocab_start, c.tensor(), {sequence_parallel, seq_dim}); });
           return y;
         });
  tp.def("vocab_parallel_cross_entropy",
         [](const at::Tensor& logits, const at::Tensor& targets, ParallelContext& c, int64_t ignore_index) {
           at::Tensor y;
           blocking([&] { y = vocab_parallel_cross_entropy(logits, targets, c.tensor(), ignore_index); });
           return y;
         });
  tp.def("slice", &tensor_parallel_slice, py::arg("whole"), py::arg("rank"), py::arg("ranks"), py::arg("dim"),
         py::arg("fused") = 1, py::arg("what") = "a tensor");
  tp.def("whole", [](const at::Tensor& slice, ParallelContext& c, int64_t dim, int64_t fused) {
    at::Tensor y;
    blocking([&] { y = tensor_parallel_whole(slice, c.tensor(), dim, fused); });
    return y;
  }, py::arg("slice"), py::arg("context"), py::arg("dim"), py::arg("fused") = 1);
}

}  // namespace tessera
