#include "parallel/topology.h"

namespace tessera {

const char* axis_name(Axis axis) {
  switch (axis) {
    case Axis::Pipe: return "pipe";
    case Axis::Data: return "data";
    case Axis::Tensor: return "tensor";
    case Axis::Model: return "model";
  }
  return "?";
}

Coordinates GridShape::coordinates_of(int rank) const {
  Coordinates c;
  c.tensor = rank % tensor;
  c.data = (rank / tensor) % data;
  c.pipe = rank / (tensor * data);
  return c;
}

std::vector<int> GridShape::group_of(Axis axis, int rank) const {
  Coordinates me = coordinates_of(rank);
  std::vector<int> ranks;
  switch (axis) {
    case Axis::Tensor:
      for (int t = 0; t < tensor; ++t) ranks.push_back(rank_of({me.pipe, me.data, t}));
      break;
    case Axis::Data:
      for (int d = 0; d < data; ++d) ranks.push_back(rank_of({me.pipe, d, me.tensor}));
      break;
    case Axis::Pipe:
      for (int p = 0; p < pipe; ++p) ranks.push_back(rank_of({p, me.data, me.tensor}));
      break;
    case Axis::Model:
      for (int p = 0; p < pipe; ++p)
        for (int t = 0; t < tensor; ++t) ranks.push_back(rank_of({p, me.data, t}));
      break;
  }
  return ranks;
}

std::vector<std::vector<int>> GridShape::all_groups(Axis axis) const {
  std::vector<std::vector<int>> groups;
  std::vector<bool> seen(world_size(), false);
  for (int r = 0; r < world_size(); ++r) {
    if (seen[r]) continue;
    groups.push_back(group_of(axis, r));
    for (int member : groups.back()) seen[member] = true;
  }
  return groups;
}

std::string GridShape::str() const {
  return "pipe " + std::to_string(pipe) + " x data " + std::to_string(data) + " x tensor " + std::to_string(tensor);
}

std::optional<GridShape> make_grid_shape(int world_size, int tensor, int pipe, std::string* error) {
  auto fail = [&](const std::string& message) -> std::optional<GridShape> {
    if (error) *error = message;
    return std::nullopt;
  };
  if (world_size < 1) return fail("world size must be at least 1, found " + std::to_string(world_size));
  if (tensor < 1) return fail("tensor_parallel.tp_size must be at least 1, found " + std::to_string(tensor));
  if (pipe < 1) return fail("pipeline.stages must be at least 1, found " + std::to_string(pipe));
  int model = tensor * pipe;
  if (world_size % model != 0)
    return fail("world size " + std::to_string(world_size) + " is not divisible by tensor_parallel.tp_size (" +
                std::to_string(tensor) + ") x pipeline.stages (" + std::to_string(pipe) + ") = " +
                std::to_string(model));
  return GridShape{pipe, world_size / model, tensor};
}

}  // namespace tessera
