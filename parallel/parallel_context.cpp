#include "parallel/parallel_context.h"

#include <algorithm>
#include <stdexcept>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

namespace tessera {

std::unique_ptr<ParallelContext> ParallelContext::from_environment(const ParallelOptions& options) {
  return std::make_unique<ParallelContext>(rendezvous_info_from_environment(), options);
}

ParallelContext::ParallelContext(const RendezvousInfo& info, const ParallelOptions& options) : info_(info), options_(options) {
  grid_ = *make_grid_shape(info.world_size, 1, 1, nullptr);  // data-parallel only until the axis groups exist
  if (options.backend == "nccl" || (options.backend == "auto" && nccl_available())) backend_ = BackendKind::Nccl;
  else if (options.backend != "gloo" && options.backend != "auto")
    throw std::invalid_argument("tessera: unknown backend '" + options.backend + "' (expected auto, gloo or nccl)");
  if (!options.defer_axis_groups) check_degrees(options.tensor, options.pipe, options.context);
  device_ = resolve_device(options.device);

  // NCCL binds a group to the current CUDA device: make it this rank's GPU before any group exists.
  set_current_device(device_);
  store_ = rendezvous(info_);
  std::vector<int> everyone(info.world_size);
  for (int r = 0; r < info.world_size; ++r) everyone[r] = r;
  world_ = make_group("world", everyone, options);
  if (!options.defer_axis_groups) make_axis_groups(options.tensor, options.pipe, "", options.context);
}

GridShape ParallelContext::check_degrees(int tensor, int pipe, int context) const {
  std::string error;
  auto grid = make_grid_shape(info_.world_size, tensor, pipe, &error, context);
  if (!grid) throw std::invalid_argument("tessera: " + error);
  return *grid;
}

c10::Device ParallelContext::resolve_device(const std::string& device) const {
  const c10::Device own = collective_device(backend_, info_.local_rank);
  if (device == "auto" || device.empty()) return own;
  c10::Device wanted = own;
  try {
    wanted = c10::Device(device);
  } catch (const std::exception&) {
    throw std::invalid_argument("tessera: unknown device '" + device + "' (expected auto, cpu, cuda or cuda:N)");
  }
  if (wanted.is_cuda() && !wanted.has_index()) wanted.set_index(static_cast<c10::DeviceIndex>(info_.local_rank));
  if (!wanted.is_cpu() && !wanted.is_cuda())
    throw std::invalid_argument("tessera: device '" + device + "': the groups take CPU or CUDA tensors");
  if (backend_ == BackendKind::Nccl && wanted != own)
    throw std::invalid_argument("tessera: device '" + device + "' with NCCL, whose ranks each use their own GPU (" +
                                own.str() + " here); use backend gloo to keep tensors on " + wanted.str());
  return wanted;
}

void ParallelContext::make_axis_groups(int tensor, int pipe, const std::string& device, int context) {
  if (axis_groups_made())
    throw std::logic_error("tessera: the axis groups exist already (" + grid_.str() + "); they are made once");
  const GridShape grid = check_degrees(tensor, pipe, context);
  if (!device.empty()) {
    device_ = resolve_device(device);
    set_current_device(device_);
  }
  // All or none: a failure half-way leaves the context as it was.
  auto data = make_group("data", grid.group_of(Axis::Data, info_.rank), options_);
  auto context_group = make_group("context", grid.group_of(Axis::Context, info_.rank), options_);
  std::unique_ptr<Communicator> replicas;
  if (grid.context > 1) replicas = make_group("data*context", grid.group_of(Axis::Replicas, info_.rank), options_);
  auto tensor_group = make_group("tensor", grid.group_of(Axis::Tensor, info_.rank), options_);
  auto pipe_group = make_group("pipe", grid.group_of(Axis::Pipe, info_.rank), options_);
  auto model = make_group("model", grid.group_of(Axis::Model, info_.rank), options_);
  grid_ = grid;
  axes_ = NamedAxes(grid);
  data_ = std::move(data), context_ = std::move(context_group), replicas_ = std::move(replicas);
  tensor_ = std::move(tensor_group), pipe_ = std::move(pipe_group), model_ = std::move(model);
}

Communicator& ParallelContext::axis(const std::unique_ptr<Communicator>& group) const {
  if (!group)
    throw std::logic_error("tessera: the data/tensor/pipe groups are not made yet: only the world group exists "
                           "until the parallel degrees are known (tessera.initialize makes them from the config)");
  return *group;
}

ParallelContext::~ParallelContext() = default;

Communicator& ParallelContext::data_parameters() {
  axis(data_);
  if (!data_parameters_)
    data_parameters_ = make_group("data_parameters", grid_.group_of(Axis::Replicas, info_.rank), options_);
  return *data_parameters_;
}

const NamedAxes& ParallelContext::axes() const {
  axis(data_);
  return axes_;
}

void ParallelContext::split_axis(const std::string& axis_name, const std::vector<std::pair<std::string, int>>& factors) {
  axis(data_);
  axes_.split(axis_name, factors);
}

Communicator& ParallelContext::group_over(const std::string& spec, const std::string& channel) {
  const std::string name = spec.empty() ? "data" : spec;
  if (channel.empty()) {
    if (name == "world") return world();
    if (name == "data") return data();
    if (name == "context") return context();
    if (name == "data*context" || name == "context*data") return replicas();
    if (name == "tensor") return tensor();
    if (name == "pipe") return pipe();
    if (name == "model") return model();
  } else if (channel == "parameters" && (name == "data*context" || (name == "data" && grid_.context == 1))) {
    return data_parameters();
  }
  axis(data_);
  const std::string key = channel.empty() ? name : name + "#" + channel;
  auto& group = named_[key];
  if (!group) group = make_group(key, name == "world" ? world_->global_ranks() : axes_.group_of(name, info_.rank), options_);
  return *group;
}

Communicator& ParallelContext::pipe_stages(const std::vector<int>& stages) {
  auto& group = pipe_stages_[stages];
  if (!group) {
    const std::vector<int> pipe = grid_.group_of(Axis::Pipe, info_.rank);  // global ranks by stage
    std::vector<int> ranks;
    std::string name = "pipe_stages";
    for (int s : stages) {
      if (s < 0 || s >= static_cast<int>(pipe.size()) || (!ranks.empty() && pipe[s] <= ranks.back()))
        throw std::invalid_argument("pipe_stages: stages must be distinct, ascending and below " + std::to_string(pipe.size()));
      ranks.push_back(pipe[s]);
      name += "_" + std::to_string(s);
    }
    if (std::find(ranks.begin(), ranks.end(), info_.rank) == ranks.end())
      throw std::invalid_argument("pipe_stages: this rank's stage " + std::to_string(coordinates().pipe) + " is not among them");
    group = make_group(name, ranks, options_);
  }
  return *group;
}

std::unique_ptr<Communicator> ParallelContext::make_group(const std::string& name, std::vector<int> ranks,
                                                          const ParallelOptions& options) {
  // Each group meets under its own store prefix, named by its axis and first member, so groups of
  // the same axis never mix and no rank needs to create groups it is not in.
  std::string prefix = "tessera/group/" + name + "/" + std::to_string(ranks.front());
  auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, store_);
  int group_rank = static_cast<int>(std::find(ranks.begin(), ranks.end(), info_.rank) - ranks.begin());
  auto backend = make_backend(backend_, store, group_rank, static_cast<int>(ranks.size()), info_.timeout);
  CommunicatorOptions comm = with_backend_defaults(options.communicator, backend_ == BackendKind::Gloo);
  comm.timeout = info_.timeout;
  comm.stage_cuda_through_host = backend_ == BackendKind::Gloo;  // only CUDA tensors are staged
  return std::make_unique<Communicator>(std::move(backend), name, std::move(ranks), group_rank, device_,
                                        has_native_reduce_scatter(backend_), comm);
}

Communicator& ParallelContext::group(Axis axis) {
  switch (axis) {
    case Axis::Data: return data();
    case Axis::Context: return context();
    case Axis::Replicas: return replicas();
    case Axis::Tensor: return tensor();
    case Axis::Pipe: return pipe();
    case Axis::Model: return model();
  }
  return world();
}

std::vector<std::pair<std::string, Communicator*>> ParallelContext::communicators() const {
  std::vector<std::pair<std::string, Communicator*>> out;
  const std::pair<const char*, const std::unique_ptr<Communicator>*> own[] = {
      {"world", &world_},   {"data", &data_},   {"context", &context_}, {"data*context", &replicas_},
      {"tensor", &tensor_}, {"pipe", &pipe_},   {"model", &model_},     {"data#parameters", &data_parameters_}};
  auto listed = [&](const Communicator* c) {
    for (const auto& [name, p] : out)
      if (p == c) return true;
    return false;
  };
  for (const auto& [name, group] : own)
    if (*group && !listed(group->get())) out.emplace_back(name, group->get());
  for (const auto& [name, group] : named_)
    if (group && !listed(group.get())) out.emplace_back(name, group.get());
  return out;
}

std::string ParallelContext::describe() const {
  Coordinates c = coordinates();
  if (!axis_groups_made())
    return "rank " + std::to_string(rank()) + " of " + std::to_string(world_size()) + " (world group only), " +
           backend_name(backend_);
  return "rank " + std::to_string(rank()) + " of " + std::to_string(world_size()) + " (pipe " +
         std::to_string(c.pipe) + ", data " + std::to_string(c.data) +
         (grid_.context > 1 ? ", context " + std::to_string(c.context) : "") + ", tensor " + std::to_string(c.tensor) +
         ") in " + grid_.str() + ", " + backend_name(backend_) + (device_.is_cpu() ? "" : " on " + device_.str());
}

}  // namespace tessera
