// The rank grid `pipe × data × context × tensor`, tensor varying fastest so tensor-parallel peers
// share a node (as in Megatron and DeepSpeed's PipeModelDataParallelTopology), context next (its
// all-to-alls and ring passes are the next most frequent). Pure arithmetic: which rank sits at
// which coordinates, and which ranks form each axis's groups. Context-parallel ranks (Ulysses,
// ring attention: parallel/context_parallel/) see the same samples, each a part of every sequence;
// data-parallel ranks see different samples.
#pragma once

#include <optional>
#include <string>
#include <vector>
#include <utility>

namespace tessera {

enum class Axis {
  Pipe,
  Data,
  Context,
  Tensor,
  Model,     // tensor × pipe: the ranks that together hold one model replica
  Replicas,  // data × context: the ranks holding the same parameters (gradients averaged, ZeRO partitions)
};
const char* axis_name(Axis axis);

// (Aggregate order pipe, data, tensor, context: `context` came last so {pipe, data, tensor} reads
// as before; the rank order is pipe × data × context × tensor.)
struct Coordinates {
  int pipe = 0, data = 0, tensor = 0, context = 0;
  bool operator==(const Coordinates& o) const {
    return pipe == o.pipe && data == o.data && tensor == o.tensor && context == o.context;
  }
};

struct GridShape {
  int pipe = 1, data = 1, tensor = 1, context = 1;
  int world_size() const { return pipe * data * context * tensor; }
  int rank_of(const Coordinates& c) const { return ((c.pipe * data + c.data) * context + c.context) * tensor + c.tensor; }
  Coordinates coordinates_of(int rank) const;
  // The ranks of `rank`'s group along `axis`, in increasing order (the group rank is the index).
  std::vector<int> group_of(Axis axis, int rank) const;
  // Every group along `axis`, each in increasing order.
  std::vector<std::vector<int>> all_groups(Axis axis) const;
  std::string str() const;  // "pipe 2 x data 2 x tensor 1"; "... x context 2 x ..." when there is one
};

// The grid's axes by name, and the factors an axis is split into (for example the data axis as
// expert_data × expert, the expert factor varying fastest): each is plain arithmetic on ranks,
// coordinate = (rank / stride) mod size. A group is named by the axes it spans, "data" or a
// product "expert_data*expert": the ranks that share every other coordinate with this one.
struct AxisSpan {
  std::string name;
  int size = 1;
  int stride = 1;
};

class NamedAxes {
 public:
  NamedAxes() : NamedAxes(GridShape{}) {}
  explicit NamedAxes(const GridShape& grid);
  // Splits `axis` into `factors`, outer to inner (the last varies fastest); their sizes multiply
  // to the axis's; one factor may be -1, the size the others leave. The same split again is a
  // no-op; another one under a used name is an error.
  void split(const std::string& axis, const std::vector<std::pair<std::string, int>>& factors);
  const AxisSpan& axis(const std::string& name) const;  // throws std::invalid_argument listing the names
  // The ranks of `rank`'s group over `spec` ("data", "tensor*data", "expert_data*expert"), in
  // increasing order (the group rank is the index). Axes that overlap (data with a factor of it)
  // are an error naming them.
  std::vector<int> group_of(const std::string& spec, int rank) const;
  // Whether the groups over `spec` vary along `axis` (some members differ in its coordinate).
  bool spans(const std::string& spec, const std::string& axis) const;
  std::string names() const;  // "pipe, data, context, tensor, expert_data, expert"

 private:
  int world_ = 1;
  std::vector<AxisSpan> axes_;
};

// The one place where parallel degrees are checked: data = world / (tensor · pipe · context).
// Returns nullopt and sets `error` (naming the config keys) when the degrees do not fit.
std::optional<GridShape> make_grid_shape(int world_size, int tensor, int pipe, std::string* error, int context = 1);

}  // namespace tessera
