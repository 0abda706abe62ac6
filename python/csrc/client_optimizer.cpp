#include "client_optimizer.h"

#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace tessera {

namespace {

// One ZeRO group's share of the client optimizer. The client optimizer steps every group at once
// (one optimizer.step() per engine step, as under DeepSpeed), so ShardOptimizer.step waits for the
// last group's call; the engine steps its groups one after another within one step (a
// non-elementwise optimizer is never stepped bucket by bucket: elementwise() is false).
class ClientShardOptimizer final : public FlatOptimizer {
 public:
  ClientShardOptimizer(py::object runner, int group, std::string name)
      : runner_(std::move(runner)), group_(group), name_(std::move(name)) {}

  ~ClientShardOptimizer() override {
    py::gil_scoped_acquire gil;  // the engine may go while the GIL is released (a failed construction)
    runner_ = py::object();
  }

  void step(const StepInputs& in, const std::vector<ShardSegment>& segments) override {
    py::gil_scoped_acquire gil;
    std::vector<at::Tensor> params;
    for (const ShardSegment& s : segments) params.push_back(s.params);
    py::object beta1 = in.beta1 ? py::object(py::float_(*in.beta1)) : py::none();
    py::object beta2 = in.beta2 ? py::object(py::float_(*in.beta2)) : py::none();
    runner_.attr("step")(group_, params, in.lr, in.grad_scale, beta1, beta2);
  }

  int64_t state_bytes() const override {
    py::gil_scoped_acquire gil;
    return runner_.attr("state_bytes")(group_).cast<int64_t>();
  }

  bool elementwise() const override { return false; }  // unknown: the whole shard at once
  const char* name() const override { return name_.c_str(); }

  std::vector<std::pair<std::string, at::Tensor>> named_state() const override {
    py::gil_scoped_acquire gil;
    std::vector<std::pair<std::string, at::Tensor>> out;
    layouts_.clear();
    for (py::handle item : runner_.attr("named_state")(group_)) {
      auto [name, tensor, layout] = item.cast<std::tuple<std::string, at::Tensor, std::string>>();
      layouts_.emplace_back(name, layout == "shard"     ? StateLayout::Shard
                                  : layout == "uniform" ? StateLayout::Uniform
                                                        : StateLayout::RankLocal);
      out.emplace_back(std::move(name), std::move(tensor));
    }
    return out;
  }

  StateLayout state_layout(const std::string& name) const override {
    for (const auto& [n, layout] : layouts_)
      if (n == name) return layout;
    return StateLayout::RankLocal;
  }

  bool materialize_state() override {
    py::gil_scoped_acquire gil;
    return runner_.attr("materialize_state")().cast<bool>();
  }

  void discard_materialized_state() override {
    py::gil_scoped_acquire gil;
    try {
      runner_.attr("discard_materialized_state")();
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("tessera: discarding a client optimizer's materialized state");
    }
  }

 private:
  py::object runner_;
  int group_;
  std::string name_;
  mutable std::vector<std::pair<std::string, StateLayout>> layouts_;  // from the last named_state()
};

}  // namespace

ClientOptimizerFactory client_optimizer_factory(py::object runner) {
  // Shared, so the factory (copied into the model description) drops its reference with the GIL held.
  auto held = std::shared_ptr<py::object>(new py::object(std::move(runner)), [](py::object* o) {
    py::gil_scoped_acquire gil;
    delete o;
  });
  return [held](int group, int source, const std::vector<ShardSegment>& segments,
                int64_t shard_numel) -> std::unique_ptr<FlatOptimizer> {
    py::gil_scoped_acquire gil;
    std::vector<at::Tensor> params, grads, computes;
    std::vector<int64_t> offsets;
    for (const ShardSegment& s : segments) {
      params.push_back(s.params);
      grads.push_back(s.grads);
      computes.push_back(s.compute_copy);  // undefined (None) in fp32 training
      offsets.push_back(s.local_offset);
    }
    held->attr("bind")(group, source, params, grads, computes, offsets, shard_numel);
    return std::make_unique<ClientShardOptimizer>(*held, group, held->attr("type_name").cast<std::string>());
  };
}

}  // namespace tessera
