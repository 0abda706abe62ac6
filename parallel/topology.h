// The rank grid `pipe × data × tensor`, tensor varying fastest so tensor-parallel peers share a
// node (as in Megatron and DeepSpeed's PipeModelDataParallelTopology). Pure arithmetic: which
// rank sits at which coordinates, and which ranks form each axis's groups.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace tessera {

enum class Axis { Pipe, Data, Tensor, Model /* tensor × pipe: ranks that share one model replica */ };
const char* axis_name(Axis axis);

struct Coordinates {
  int pipe = 0, data = 0, tensor = 0;
  bool operator==(const Coordinates& o) const { return pipe == o.pipe && data == o.data && tensor == o.tensor; }
};

struct GridShape {
  int pipe = 1, data = 1, tensor = 1;
  int world_size() const { return pipe * data * tensor; }
  int rank_of(const Coordinates& c) const { return (c.pipe * data + c.data) * tensor + c.tensor; }
  Coordinates coordinates_of(int rank) const;
  // The ranks of `rank`'s group along `axis`, in increasing order (the group rank is the index).
  std::vector<int> group_of(Axis axis, int rank) const;
  // Every group along `axis`, each in increasing order.
  std::vector<std::vector<int>> all_groups(Axis axis) const;
  std::string str() const;  // "pipe 2 × data 2 × tensor 1"
};

// The one place where parallel degrees are checked: data = world / (tensor · pipe).
// Returns nullopt and sets `error` (naming the config keys) when the degrees do not fit.
std::optional<GridShape> make_grid_shape(int world_size, int tensor, int pipe, std::string* error);

}  // namespace tessera
