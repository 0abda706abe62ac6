#include "zero/units.h"

#include <algorithm>
#include <stdexcept>

namespace tessera {

const char* unit_event_name(UnitEvent e) {
  switch (e) {
    case UnitEvent::ForwardBegin: return "forward_begin";
    case UnitEvent::ForwardEnd: return "forward_end";
    case UnitEvent::BackwardBegin: return "backward_begin";
    case UnitEvent::BackwardEnd: return "backward_end";
  }
  return "?";
}

UnitTracker::UnitTracker(const ModelDescription& model, const std::unordered_map<const void*, std::string>& names) {
  auto name_of = [&](const at::Tensor& t) {
    auto it = names.find(t.unsafeGetTensorImpl());
    return it == names.end() ? std::string("(unnamed)") : it->second;
  };
  std::vector<const ModelUnit*> given;
  for (const ModelUnit& u : model.units) given.push_back(&u);
  ModelUnit whole;  // no units given: the model is one unit
  if (given.empty()) {
    whole.name = "model";
    for (const ParamGroup& g : model.groups) whole.params.insert(whole.params.end(), g.params.begin(), g.params.end());
    given.push_back(&whole);
  }
  for (const ModelUnit* spec : given) {
    UnitInfo info;
    std::vector<const void*> uses;
    int owned = 0;
    info.name = spec->name.empty() ? "unit " + std::to_string(units_.size()) : spec->name;
    for (const at::Tensor& p : spec->params) {
      if (!p.defined()) throw std::invalid_argument("tessera: unit '" + info.name + "' lists an undefined tensor");
      if (!names.count(p.unsafeGetTensorImpl()))
        throw std::invalid_argument("tessera: unit '" + info.name + "' lists a tensor that is in no parameter group");
      info.params.push_back(name_of(p));
      uses.push_back(p.unsafeGetTensorImpl());
      auto [it, fresh] = owner_.emplace(p.unsafeGetTensorImpl(), static_cast<int>(units_.size()));
      if (fresh) info.owned_numel += p.numel(), ++owned;
      else if (it->second != static_cast<int>(units_.size())) info.shared.push_back(name_of(p));
    }
    units_.push_back(std::move(info));
    uses_.push_back(std::move(uses));
    owned_params_.push_back(owned);
  }
  const size_t n = units_.size();
  remaining_ = owned_params_;
  forward_open_.assign(n, 0);
  backward_open_.assign(n, 0);
  forward_start_.resize(n);
  backward_start_.resize(n);
  stats_.assign(n, UnitStats{});
  began_.assign(n, 0);
  watched_.assign(n, 0);
}

void UnitTracker::remove_listener(UnitListener* listener) {
  listeners_.erase(std::remove(listeners_.begin(), listeners_.end(), listener), listeners_.end());
}

int UnitTracker::owner_of(const at::Tensor& param) const {
  auto it = owner_.find(param.unsafeGetTensorImpl());
  return it == owner_.end() ? -1 : it->second;
}

void UnitTracker::check(int u, const char* what) const {
  if (u < 0 || u >= size())
    throw std::out_of_range(std::string("tessera: ") + what + " of unit " + std::to_string(u) + ", but the model has " +
                            std::to_string(size()) + " units");
}

void UnitTracker::emit(int u, UnitEvent e) {
  if (record_) trace_.emplace_back(u, e);
  for (UnitListener* l : listeners_) l->on_unit_event(u, e);
}

void UnitTracker::forward_begin(int u) {
  check(u, "forward begin");
  forward_open_[u] = 1;
  began_[u] = 1;
  watched_[u] = 0;
  forward_start_[u] = Clock::now();
  emit(u, UnitEvent::ForwardBegin);
}

void UnitTracker::forward_end(int u) {
  check(u, "forward end");
  if (!forward_open_[u]) return;  // a scope moved from, or ended twice
  forward_open_[u] = 0;
  stats_[u].forwards += 1;
  stats_[u].forward_s += std::chrono::duration<double>(Clock::now() - forward_start_[u]).count();
  emit(u, UnitEvent::ForwardEnd);
}

void UnitTracker::end_backward_of(int u) {
  backward_open_[u] = 0;
  stats_[u].backwards += 1;
  stats_[u].backward_s += std::chrono::duration<double>(Clock::now() - backward_start_[u]).count();
  emit(u, UnitEvent::BackwardEnd);
}

void UnitTracker::begin_backward_of(int u) {
  // A later unit that owns no parameter still waiting (its weights are tied to an earlier unit's)
  // is done once autograd has moved on to an earlier unit.
  for (int v = size() - 1; v > u; --v)
    if (backward_open_[v] && remaining_[v] == 0) end_backward_of(v);
  backward_open_[u] = 1;
  backward_start_[u] = Clock::now();
  emit(u, UnitEvent::BackwardBegin);
}

void UnitTracker::output_gradient(int u) {
  check(u, "output gradient");
  if (!backward_open_[u] && remaining_[u] == owned_params_[u]) begin_backward_of(u);
}

void UnitTracker::parameter_gradient(int u) {
  if (u < 0) return;
  if (!backward_open_[u]) begin_backward_of(u);
  if (--remaining_[u] > 0) return;
  end_backward_of(u);
}

void UnitTracker::end_backward() {
  // Backward runs from the last unit to the first: close the stragglers in that order.
  for (int u = size() - 1; u >= 0; --u) {
    if (remaining_[u] == 0 && !backward_open_[u]) continue;  // closed by its parameters
    if (!backward_open_[u]) begin_backward_of(u);
    end_backward_of(u);
  }
  remaining_ = owned_params_;
  reports_units_ = true;
  for (int u = 0; u < size(); ++u) reports_units_ = reports_units_ && (began_[u] || uses_[u].empty());
  std::fill(began_.begin(), began_.end(), 0);
}

void UnitTracker::abort_backward() {
  std::fill(backward_open_.begin(), backward_open_.end(), 0);
  std::fill(forward_open_.begin(), forward_open_.end(), 0);
  std::fill(began_.begin(), began_.end(), 0);
  remaining_ = owned_params_;
  reports_units_ = false;
}

}  // namespace tessera
