// UnitTracker: where the model is in its forward and backward, unit by unit (zero/model.h).
//
// Events, per micro-step, in the order they happen:
//   ForwardBegin(u), ForwardEnd(u)   the model enters and leaves unit u (Engine::unit(u) in C++,
//                                    module hooks in Python), u = 0, 1, ... in forward order
//   BackwardBegin(u)                 autograd reached u's output (a gradient hook on it), or, when
//                                    the model did not hand the output over, u's first parameter
//                                    gradient arrived
//   BackwardEnd(u)                   every parameter u owns has its gradient (the post-accumulate
//                                    hooks ZeRO already installs); for a unit that owns none (its
//                                    weights are tied to an earlier unit's), when an earlier unit's
//                                    backward begins; for a unit some of whose parameters got no
//                                    gradient, when backward ends
// Listeners (ZeRO-3 gather/release, pipeline stages, offload prefetch in later issues) get each
// event synchronously on the thread that produced it; the tracker itself keeps per-unit counts
// and seconds (unit_stats) and, when asked, the ordered trace of events (for tests).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "zero/model.h"

namespace tessera {

enum class UnitEvent { ForwardBegin, ForwardEnd, BackwardBegin, BackwardEnd };
const char* unit_event_name(UnitEvent e);

class UnitListener {
 public:
  virtual ~UnitListener() = default;
  virtual void on_unit_event(int unit, UnitEvent event) = 0;
};

struct UnitInfo {
  std::string name;
  std::vector<std::string> params;  // the names of the parameters it uses (its own and shared ones)
  std::vector<std::string> shared;  // parameters it uses but an earlier unit owns (tied weights)
  int64_t owned_numel = 0;
};

struct UnitStats {
  int64_t forwards = 0, backwards = 0;
  double forward_s = 0, backward_s = 0;  // begin to end, summed
};

class UnitTracker {
 public:
  // `names(t)` names a parameter for the unit listing (the engine passes its group's names).
  UnitTracker(const ModelDescription& model, const std::unordered_map<const void*, std::string>& names);

  int size() const { return static_cast<int>(units_.size()); }
  const UnitInfo& unit(int u) const { return units_.at(u); }
  // The unit that owns a parameter (the first that lists it), -1 for a tensor no unit lists.
  int owner_of(const at::Tensor& param) const;

  void forward_begin(int u);
  void forward_end(int u);
  void output_gradient(int u);     // a gradient reached u's output: its backward begins
  // The model handed over u's output in this forward (a hook will report its backward's begin).
  void output_watched(int u) { check(u, "output"); watched_[u] = 1; }
  bool is_output_watched(int u) const { return watched_.at(u) != 0; }
  void parameter_gradient(int u);  // a parameter u owns got its gradient
  void end_backward();             // closes the units still open (parameters without gradients)
  void abort_backward();           // a backward that threw: forgets the open units, emits nothing

  // The parameters (TensorImpl*) unit u's forward uses: its own and the shared ones.
  const std::vector<const void*>& params_used(int u) const { return uses_.at(u); }
  // Whether the last backward's forward reported every unit that uses parameters (so a unit's
  // forward_begin comes before its parameters are read: what deferring the allgather needs).
  bool model_reports_units() const { return reports_units_; }

  void add_listener(UnitListener* listener) { listeners_.push_back(listener); }
  void remove_listener(UnitListener* listener);
  void record_trace(bool on) { record_ = on; if (!on) trace_.clear(); }
  const std::vector<std::pair<int, UnitEvent>>& trace() const { return trace_; }
  void clear_trace() { trace_.clear(); }
  const std::vector<UnitStats>& stats() const { return stats_; }

 private:
  using Clock = std::chrono::steady_clock;
  void check(int u, const char* what) const;
  void emit(int u, UnitEvent e);
  void begin_backward_of(int u);
  void end_backward_of(int u);

  std::vector<UnitInfo> units_;
  std::vector<std::vector<const void*>> uses_;
  std::vector<char> began_;  // per unit: a forward began since the last backward ended
  std::vector<char> watched_;  // per unit: its output was handed over in its last forward
  bool reports_units_ = false;
  std::unordered_map<const void*, int> owner_;  // TensorImpl* -> unit
  std::vector<int> owned_params_, remaining_;
  std::vector<char> forward_open_, backward_open_;
  std::vector<Clock::time_point> forward_start_, backward_start_;
  std::vector<UnitStats> stats_;
  std::vector<UnitListener*> listeners_;
  bool record_ = false;
  std::vector<std::pair<int, UnitEvent>> trace_;
};

}  // namespace tessera
