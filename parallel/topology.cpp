#include "parallel/topology.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace tessera {

const char* axis_name(Axis axis) {
  switch (axis) {
    case Axis::Pipe: return "pipe";
    case Axis::Data: return "data";
    case Axis::Context: return "context";
    case Axis::Tensor: return "tensor";
    case Axis::Model: return "model";
    case Axis::Replicas: return "data*context";
  }
  return "?";
}

Coordinates GridShape::coordinates_of(int rank) const {
  Coordinates c;
  c.tensor = rank % tensor;
  c.context = (rank / tensor) % context;
  c.data = (rank / (tensor * context)) % data;
  c.pipe = rank / (tensor * context * data);
  return c;
}

std::vector<int> GridShape::group_of(Axis axis, int rank) const {
  Coordinates me = coordinates_of(rank);
  std::vector<int> ranks;
  switch (axis) {
    case Axis::Tensor:
      for (int t = 0; t < tensor; ++t) ranks.push_back(rank_of({me.pipe, me.data, t, me.context}));
      break;
    case Axis::Data:
      for (int d = 0; d < data; ++d) ranks.push_back(rank_of({me.pipe, d, me.tensor, me.context}));
      break;
    case Axis::Context:
      for (int c = 0; c < context; ++c) ranks.push_back(rank_of({me.pipe, me.data, me.tensor, c}));
      break;
    case Axis::Pipe:
      for (int p = 0; p < pipe; ++p) ranks.push_back(rank_of({p, me.data, me.tensor, me.context}));
      break;
    case Axis::Model:
      for (int p = 0; p < pipe; ++p)
        for (int t = 0; t < tensor; ++t) ranks.push_back(rank_of({p, me.data, t, me.context}));
      break;
    case Axis::Replicas:
      for (int d = 0; d < data; ++d)
        for (int c = 0; c < context; ++c) ranks.push_back(rank_of({me.pipe, d, me.tensor, c}));
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
  return "pipe " + std::to_string(pipe) + " x data " + std::to_string(data) +
         (context > 1 ? " x context " + std::to_string(context) : "") + " x tensor " + std::to_string(tensor);
}

NamedAxes::NamedAxes(const GridShape& grid) : world_(grid.world_size()) {
  axes_ = {{"pipe", grid.pipe, grid.data * grid.context * grid.tensor},
           {"data", grid.data, grid.context * grid.tensor},
           {"context", grid.context, grid.tensor},
           {"tensor", grid.tensor, 1}};
}

const AxisSpan& NamedAxes::axis(const std::string& name) const {
  for (const AxisSpan& a : axes_)
    if (a.name == name) return a;
  throw std::invalid_argument("tessera: no parallel axis named '" + name + "' (the axes: " + names() + ")");
}

std::string NamedAxes::names() const {
  std::string out;
  for (const AxisSpan& a : axes_) out += (out.empty() ? "" : ", ") + a.name;
  return out;
}

void NamedAxes::split(const std::string& axis_name, const std::vector<std::pair<std::string, int>>& factors) {
  const AxisSpan whole = axis(axis_name);
  std::vector<std::pair<std::string, int>> sized = factors;  // a size of -1: what the others leave
  int known = 1, rest = -1;
  for (size_t i = 0; i < sized.size(); ++i) {
    if (sized[i].second == -1 && rest < 0) rest = static_cast<int>(i);
    else if (sized[i].second >= 1) known *= sized[i].second;
  }
  if (rest >= 0) {
    if (whole.size % known != 0)
      throw std::invalid_argument("tessera: the " + axis_name + " axis has " + std::to_string(whole.size) +
                                  " ranks, which the other factors of '" + sized[rest].first + "' (" +
                                  std::to_string(known) + " ranks) do not divide");
    sized[rest].second = whole.size / known;
  }
  std::vector<AxisSpan> made;
  int stride = whole.stride, product = 1;
  for (auto it = sized.rbegin(); it != sized.rend(); ++it) {  // the innermost first
    const auto& [name, size] = *it;
    if (size < 1) throw std::invalid_argument("tessera: factor '" + name + "' of the " + axis_name + " axis has size " + std::to_string(size));
    made.push_back({name, size, stride});
    stride *= size;
    product *= size;
  }
  if (product != whole.size) {
    std::string sizes;
    for (const auto& [name, size] : sized) sizes += (sizes.empty() ? "" : " x ") + name + " " + std::to_string(size);
    throw std::invalid_argument("tessera: the " + axis_name + " axis has " + std::to_string(whole.size) +
                                " ranks, which " + sizes + " (" + std::to_string(product) + ") does not split");
  }
  for (const AxisSpan& f : made) {
    auto old = std::find_if(axes_.begin(), axes_.end(), [&](const AxisSpan& a) { return a.name == f.name; });
    if (old == axes_.end()) continue;
    if (old->size != f.size || old->stride != f.stride)
      throw std::invalid_argument("tessera: a parallel axis named '" + f.name + "' exists already, of other ranks");
  }
  for (auto it = made.rbegin(); it != made.rend(); ++it)
    if (std::none_of(axes_.begin(), axes_.end(), [&](const AxisSpan& a) { return a.name == it->name; })) axes_.push_back(*it);
}

std::vector<int> NamedAxes::group_of(const std::string& spec, int rank) const {
  std::vector<AxisSpan> spans;
  std::stringstream in(spec);
  for (std::string name; std::getline(in, name, '*');) spans.push_back(axis(name));
  if (spans.empty()) throw std::invalid_argument("tessera: an empty group name (expected axes such as data or data*tensor)");
  int base = rank;
  for (const AxisSpan& a : spans) base -= ((rank / a.stride) % a.size) * a.stride;
  std::vector<int> ranks = {base};
  for (const AxisSpan& a : spans) {
    std::vector<int> next;
    for (int r : ranks)
      for (int i = 0; i < a.size; ++i) next.push_back(r + i * a.stride);
    ranks = std::move(next);
  }
  std::sort(ranks.begin(), ranks.end());
  const bool distinct = std::adjacent_find(ranks.begin(), ranks.end()) == ranks.end();
  if (!distinct || base < 0 || ranks.back() >= world_ || std::find(ranks.begin(), ranks.end(), rank) == ranks.end())
    throw std::invalid_argument("tessera: the axes of group '" + spec + "' overlap (one is a factor of another)");
  return ranks;
}

bool NamedAxes::spans(const std::string& spec, const std::string& axis_name) const {
  const AxisSpan& a = axis(axis_name);
  const std::vector<int> ranks = group_of(spec, 0);
  for (int r : ranks)
    if ((r / a.stride) % a.size != (ranks.front() / a.stride) % a.size) return true;
  return false;
}

std::optional<GridShape> make_grid_shape(int world_size, int tensor, int pipe, std::string* error, int context) {
  auto fail = [&](const std::string& message) -> std::optional<GridShape> {
    if (error) *error = message;
    return std::nullopt;
  };
  if (world_size < 1) return fail("world size must be at least 1, found " + std::to_string(world_size));
  if (tensor < 1) return fail("tensor_parallel.tp_size must be at least 1, found " + std::to_string(tensor));
  if (pipe < 1) return fail("pipeline.stages must be at least 1, found " + std::to_string(pipe));
  if (context < 1) return fail("context_parallel.size must be at least 1, found " + std::to_string(context));
  const int model = tensor * pipe * context;
  if (world_size % model != 0)
    return fail("world size " + std::to_string(world_size) + " is not divisible by tensor_parallel.tp_size (" +
                std::to_string(tensor) + ") x pipeline.stages (" + std::to_string(pipe) + ")" +
                (context > 1 ? " x context_parallel.size (" + std::to_string(context) + ")" : std::string()) + " = " +
                std::to_string(model));
  GridShape grid{pipe, world_size / model, tensor};
  grid.context = context;
  return grid;
}

}  // namespace tessera
