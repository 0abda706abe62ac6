// ParallelContext: this process's place in the `pipe × data × context × tensor` grid and one
// Communicator per axis. Built once per process (from the environment, see parallel/rendezvous.h) and passed
// explicitly to whatever needs it; there is no global state.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "parallel/c10d_compat.h"
#include "parallel/communicator.h"
#include "parallel/rendezvous.h"
#include "parallel/topology.h"

namespace tessera {

struct ParallelOptions {
  int tensor = 1;  // tensor_parallel.tp_size
  int pipe = 1;    // pipeline.stages
  int context = 1;  // context_parallel.size (DeepSpeed's sequence_parallel_size)
  std::string backend = "auto";  // "auto" (nccl with a GPU, else gloo), "gloo", "nccl"
  // Where the model and the engine's buffers live, and so the tensors the groups take: "auto" (the
  // backend's own: the CPU for Gloo, cuda:LOCAL_RANK for NCCL), "cpu", or a CUDA device ("cuda",
  // "cuda:N"; N defaults to LOCAL_RANK). Gloo with a CUDA device stages every collective through
  // pinned host memory: several ranks can then share one GPU, which NCCL refuses.
  std::string device = "auto";
  // Make only the world group now; the axis groups come with make_axis_groups(tensor, pipe) once
  // the degrees are known (DeepSpeed's init_distributed() comes before the config is read).
  bool defer_axis_groups = false;
  CommunicatorOptions communicator;
};

class ParallelContext {
 public:
  // Rendezvous from the environment, then one process group per axis.
  static std::unique_ptr<ParallelContext> from_environment(const ParallelOptions& options = {});
  ParallelContext(const RendezvousInfo& info, const ParallelOptions& options);
  ~ParallelContext();
  ParallelContext(const ParallelContext&) = delete;
  ParallelContext& operator=(const ParallelContext&) = delete;

  int rank() const { return info_.rank; }
  int world_size() const { return info_.world_size; }
  int local_rank() const { return info_.local_rank; }
  int local_world_size() const { return info_.local_world_size; }
  const RendezvousInfo& rendezvous_info() const { return info_; }
  const GridShape& grid() const { return grid_; }
  Coordinates coordinates() const { return grid_.coordinates_of(info_.rank); }
  BackendKind backend() const { return backend_; }
  c10::Device device() const { return device_; }  // where the groups' tensors live (ParallelOptions::device)

  // Makes the data, context, tensor, pipe and model groups (and data × context when context > 1)
  // for a `pipe × data × context × tensor` grid (every rank together, once); the constructor does
  // it unless options.defer_axis_groups. `device`, when not empty, replaces ParallelOptions::device
  // first (the model's device, known only by then).
  void make_axis_groups(int tensor, int pipe, const std::string& device = "", int context = 1);
  bool axis_groups_made() const { return data_ != nullptr; }

  Communicator& world() { return *world_; }
  // Ranks that see different samples (the batch's axis: samplers, batch sizes, the loss's mean).
  Communicator& data() { return axis(data_); }
  // Ranks that see the same samples, each a part of every sequence (Ulysses, ring attention).
  Communicator& context() { return axis(context_); }
  // Ranks that hold the same parameters and see different tokens: data × context (the data group
  // itself without context parallelism). Gradients are averaged and ZeRO partitions over it, as
  // Megatron-Core's distributed optimizer does with context parallelism.
  Communicator& replicas() { return replicas_ ? *replicas_ : data(); }
  // A second group over the replicas, made on first use (every rank of the group must ask for it
  // together): ZeRO-3's parameter gathers run there, never queued behind gradient reductions.
  Communicator& data_parameters();
  Communicator& tensor() { return axis(tensor_); }
  Communicator& pipe() { return axis(pipe_); }
  Communicator& model() { return axis(model_); }  // tensor × pipe: one model replica
  Communicator& group(Axis axis);
  // Groups by the axes they span (parallel/topology.h's NamedAxes): "data", "context", "tensor",
  // "pipe", "model", "world", a product such as "data*context" (= replicas()), or factors a split_axis made. The grid's own groups
  // are the objects above; any other is made on first use by its members together and kept.
  // `channel` names a second, independent group over the same ranks ("parameters": ZeRO-3's
  // gathers, never queued behind the gradient reductions of the group without a channel).
  Communicator& group_over(const std::string& spec, const std::string& channel = "");
  // Splits a grid axis into named factors, outer to inner (every rank together, after the axis
  // groups exist): split_axis("data", {{"expert_data", 2}, {"expert", 2}}) makes data ranks
  // {0,1} and {2,3} the expert groups and {0,2}, {1,3} the expert_data groups.
  void split_axis(const std::string& axis, const std::vector<std::pair<std::string, int>>& factors);
  const NamedAxes& axes() const;
  // Some stages of this rank's pipeline (pipe-group ranks, ascending; this rank's among them), made
  // on first use by those stages' ranks together and kept: where weights tied across stages (a
  // GPT's embedding and head) sum their gradients.
  Communicator& pipe_stages(const std::vector<int>& stages);

  // Every group made so far by the name python/tessera/comm.py's calls take ("world", "data",
  // "tensor", "pipe", "context", "model", group_over's "spec" or "spec#channel"), each once: where
  // the comms logger reads the statistics of every axis.
  std::vector<std::pair<std::string, Communicator*>> communicators() const;

  std::string describe() const;  // "rank 3 of 4 (pipe 0, data 1, tensor 1) in pipe 1 x data 2 x tensor 2, gloo"

 private:
  GridShape check_degrees(int tensor, int pipe, int context) const;  // throws std::invalid_argument naming the mismatch
  c10::Device resolve_device(const std::string& device) const;  // ParallelOptions::device for this backend
  Communicator& axis(const std::unique_ptr<Communicator>& group) const;
  std::unique_ptr<Communicator> make_group(const std::string& name, std::vector<int> ranks, const ParallelOptions& o);

  RendezvousInfo info_;
  GridShape grid_;
  BackendKind backend_ = BackendKind::Gloo;
  c10::Device device_{c10::kCPU};
  c10::intrusive_ptr<c10d::Store> store_;
  ParallelOptions options_;
  std::unique_ptr<Communicator> world_, data_, context_, replicas_, tensor_, pipe_, model_, data_parameters_;
  std::map<std::vector<int>, std::unique_ptr<Communicator>> pipe_stages_;
  NamedAxes axes_;
  std::map<std::string, std::unique_ptr<Communicator>> named_;  // group_over's, by spec#channel
};

}  // namespace tessera
