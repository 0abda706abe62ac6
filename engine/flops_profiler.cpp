// The flops profiler for C++ models (engine/flops_profiler.h): ATen ops counted through a
// thread-local RecordFunction callback, attributed to the open units, reported at profile_step.
#include "engine/flops_profiler.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string_view>

#include "csrc/device_stream.h"
#include "engine/progress.h"

namespace tessera {

namespace {

// The counter of this thread. RecordFunction takes plain function pointers, so the callbacks find
// their counter here; the callback itself is thread-local (added by the thread that owns the counter).
thread_local OpCounter* active_counter = nullptr;

enum class OpRule { None, Linear, Matmul, AddMatmul, Attention, Convolution, Norm, Elementwise };

OpRule rule_of(std::string_view name) {
  static const std::map<std::string_view, OpRule> rules = {
      {"aten::linear", OpRule::Linear},
      {"aten::matmul", OpRule::Matmul},
      {"aten::mm", OpRule::Matmul},
      {"aten::bmm", OpRule::Matmul},
      {"aten::addmm", OpRule::AddMatmul},
      {"aten::baddbmm", OpRule::AddMatmul},
      {"aten::scaled_dot_product_attention", OpRule::Attention},
      {"aten::conv1d", OpRule::Convolution},
      {"aten::conv2d", OpRule::Convolution},
      {"aten::conv3d", OpRule::Convolution},
      {"aten::convolution", OpRule::Convolution},
      {"aten::layer_norm", OpRule::Norm},
      {"aten::rms_norm", OpRule::Norm},
      {"aten::relu", OpRule::Elementwise},
      {"aten::gelu", OpRule::Elementwise},
      {"aten::silu", OpRule::Elementwise},
      {"aten::softmax", OpRule::Elementwise},
  };
  auto it = rules.find(name);
  return it == rules.end() ? OpRule::None : it->second;
}

const at::Tensor* tensor_at(c10::ArrayRef<const c10::IValue> in, size_t i) {
  return i < in.size() && in[i].isTensor() ? &in[i].toTensor() : nullptr;
}

// An op's cost from its inputs; a convolution's MACs per output element (its output is counted
// when the op ends). Unusual arguments count as nothing.
struct Cost {
  OpCount count;
  int64_t macs_per_output = 0;
};

Cost cost_of(OpRule rule, c10::ArrayRef<const c10::IValue> in) {
  Cost c;
  const at::Tensor* a = tensor_at(in, 0);
  const at::Tensor* b = tensor_at(in, 1);
  switch (rule) {
    case OpRule::Linear:
      if (a && b && b->dim() >= 1) c.count.macs = a->numel() * b->size(0);
      c.count.flops = 2 * c.count.macs;
      break;
    case OpRule::Matmul:
      if (a && b && b->dim() >= 1) c.count.macs = a->numel() * b->size(-1);
      c.count.flops = 2 * c.count.macs;
      break;
    case OpRule::AddMatmul: {  // addmm(bias, m1, m2) = bias + m1 @ m2
      const at::Tensor *bias = a, *m1 = b, *m2 = tensor_at(in, 2);
      if (bias && m1 && m2 && m2->dim() >= 1) c.count.macs = m1->numel() * m2->size(-1);
      c.count.flops = 2 * c.count.macs + (c.count.macs ? bias->numel() : 0);
      break;
    }
    case OpRule::Attention: {
      const at::Tensor* v = tensor_at(in, 2);
      if (a && b && v && a->dim() >= 1 && b->dim() >= 2) {
        const int64_t lk = b->size(-2), dv = v->size(-1), rows = a->numel() / std::max<int64_t>(a->size(-1), 1);
        c.count.macs = a->numel() * lk + rows * lk * dv;
      }
      c.count.flops = 2 * c.count.macs;
      break;
    }
    case OpRule::Convolution:
      if (b && b->dim() >= 2) c.macs_per_output = b->numel() / b->size(0);  // in_channels/groups · kernel
      break;
    case OpRule::Norm: {
      const bool affine = in.size() > 2 && in[2].isTensor();
      if (a) c.count.flops = a->numel() * (affine ? 5 : 4);
      break;
    }
    case OpRule::Elementwise:
      if (a) c.count.flops = a->numel();
      break;
    case OpRule::None:
      break;
  }
  return c;
}

// What a counted op carries from its start to its end.
struct Pending : at::ObserverContext {
  bool inner = false;  // inside another counted op: not counted again
  Cost cost;
};

}  // namespace

struct OpCounterCallbacks {
  static std::unique_ptr<at::ObserverContext> start(const at::RecordFunction& fn) {
    OpCounter* counter = active_counter;
    if (!counter) return nullptr;  // a thread this callback's state was handed to (autograd's)
    const OpRule rule = rule_of(fn.name());
    if (rule == OpRule::None) return nullptr;
    auto pending = std::make_unique<Pending>();
    pending->inner = counter->depth_ > 0 || counter->paused_;
    ++counter->depth_;
    if (!pending->inner) pending->cost = cost_of(rule, fn.inputs());
    return pending;
  }

  static void end(const at::RecordFunction& fn, at::ObserverContext* context) {
    OpCounter* counter = active_counter;
    if (!counter || !context) return;
    --counter->depth_;
    auto* pending = static_cast<Pending*>(context);
    if (pending->inner) return;
    OpCount n = pending->cost.count;
    if (pending->cost.macs_per_output > 0) {
      const auto& outputs = fn.outputs();
      if (!outputs.empty() && outputs[0].isTensor()) {
        n.macs = outputs[0].toTensor().numel() * pending->cost.macs_per_output;
        n.flops = 2 * n.macs;
      }
    }
    if (n.flops || n.macs) counter->add_(n);
  }
};

OpCounter::OpCounter(std::function<void(const OpCount&)> add) : add_(std::move(add)) {
  if (active_counter) throw std::logic_error("tessera: a second flops counter on one thread");
  active_counter = this;
  handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(&OpCounterCallbacks::start, &OpCounterCallbacks::end)
                                           .needsInputs(true)
                                           .needsOutputs(true)
                                           .scopes({at::RecordScope::FUNCTION}));
}

OpCounter::~OpCounter() {
  at::removeCallback(handle_);
  if (active_counter == this) active_counter = nullptr;
}

// ---- UnitFlopsProfiler ---------------------------------------------------------------------------

UnitFlopsProfiler::UnitFlopsProfiler(FlopsProfilerConfig config, UnitTracker& units, int64_t params, FlopsRunLayout layout)
    : config_(std::move(config)), units_(units), layout_(layout), unit_start_(units.size()) {
  profile_.params = params;
  units_.add_listener(this);
}

UnitFlopsProfiler::~UnitFlopsProfiler() { units_.remove_listener(this); }

void UnitFlopsProfiler::backward_began() {
  in_backward_ = true;
  if (counter_) counter_->set_paused(true);
}

void UnitFlopsProfiler::backward_ended() {
  in_backward_ = false;
  if (counter_) counter_->set_paused(false);
}

void UnitFlopsProfiler::step_ended(int64_t global_step, const StepTimes& totals) {
  if (counter_ && global_step == config_.profile_step) finish(global_step, totals);
  else if (!counter_ && !done_ && global_step + 1 == config_.profile_step) start(totals);
}

void UnitFlopsProfiler::start(const StepTimes& totals) {
  const int64_t params = profile_.params;
  profile_ = FlopsProfile{};
  profile_.params = params;
  for (int u = 0; u < units_.size(); ++u) {
    UnitProfile unit;
    unit.name = units_.unit(u).name;
    unit.params = units_.unit(u).owned_numel;
    profile_.units.push_back(unit);
  }
  forward_before_ = totals.forward_s;
  backward_before_ = totals.backward_s + totals.reduce_s;
  step_before_ = totals.optimizer_s + totals.allgather_s;
  open_.clear();
  units_entered_ = false;
  counter_ = std::make_unique<OpCounter>([this](const OpCount& n) { add(n); });
  counter_->set_paused(in_backward_);
}

void UnitFlopsProfiler::add(const OpCount& n) {
  profile_.forward.flops += n.flops;
  profile_.forward.macs += n.macs;
  for (int u : open_) {
    profile_.units[u].forward.flops += n.flops;
    profile_.units[u].forward.macs += n.macs;
  }
}

void UnitFlopsProfiler::on_unit_event(int unit, UnitEvent event) {
  if (!counter_ || in_backward_) return;  // a recomputation inside the backward is not a forward
  if (event == UnitEvent::ForwardBegin) {
    wait_for_device_stream(layout_.device);
    unit_start_[unit] = Clock::now();
    open_.push_back(unit);
    units_entered_ = true;
  } else if (event == UnitEvent::ForwardEnd) {
    auto it = std::find(open_.begin(), open_.end(), unit);
    if (it == open_.end()) return;
    open_.erase(it);
    wait_for_device_stream(layout_.device);
    profile_.units[unit].latency_s += std::chrono::duration<double>(Clock::now() - unit_start_[unit]).count();
  }
}

void UnitFlopsProfiler::finish(int64_t global_step, const StepTimes& totals) {
  counter_.reset();
  done_ = true;
  profile_.profile_step = global_step;
  profile_.forward_s = totals.forward_s - forward_before_;
  profile_.backward_s = totals.backward_s + totals.reduce_s - backward_before_;
  profile_.step_s = totals.optimizer_s + totals.allgather_s - step_before_;
  report();
}

// ---- the report: DeepSpeed's layout (python/tessera/flops_profiler.py prints the same) -----------

namespace {

std::string number(double n, const char* billions = "G") {
  const std::pair<double, const char*> units[] = {{1e12, "T"}, {1e9, billions}, {1e6, "M"}, {1e3, "K"}};
  char buf[64];
  for (const auto& [value, unit] : units)
    if (std::abs(n) >= value) {
      std::snprintf(buf, sizeof(buf), "%.2f %s", n / value, unit);
      return buf;
    }
  std::snprintf(buf, sizeof(buf), "%.2f ", n);
  return buf;
}

std::string ms(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f ms", 1000 * s);
  return buf;
}

double ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

// "h.3" -> "h": the units of one kind, aggregated as DeepSpeed aggregates one module class.
std::string kind_of(const std::string& name) {
  const size_t dot = name.find_last_of('.');
  if (dot == std::string::npos || dot + 1 == name.size()) return name;
  return name.find_first_not_of("0123456789", dot + 1) == std::string::npos ? name.substr(0, dot) : name;
}

}  // namespace

void UnitFlopsProfiler::report() const {
  const FlopsProfile& p = profile_;
  const int mp = layout_.tensor * layout_.pipe;
  const double bwd_factor = 2.0 + config_.recompute_fwd_factor;
  const double fwd_flops = static_cast<double>(p.forward.flops);
  std::string text;
  auto out = [&](const std::string& line) { text += line + "\n"; };
  auto row = [&](const std::string& label, const std::string& value) {
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%-60s %s", (label + ":").c_str(), value.c_str());
    out(buf);
  };
  auto fmt = [](const char* f, double x) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), f, x);
    return std::string(buf);
  };
  out("\n-------------------------- tessera Flops Profiler --------------------------");
  out("Profile Summary at step " + std::to_string(p.profile_step) + ":");
  out("Notations: data parallel size (dp_size), model parallel size (mp_size), number of parameters (params), number "
      "of multiply-accumulate operations (MACs), number of floating-point operations (flops), floating-point "
      "operations per second (FLOPS), fwd latency (forward propagation latency), bwd latency (backward propagation "
      "latency), step (weights update latency), iter latency (sum of fwd, bwd and step latency)\n");
  row("world size", std::to_string(layout_.world));
  row("data parallel size", std::to_string(layout_.data));
  row("model parallel size", std::to_string(mp));
  row("batch size per GPU", std::to_string(layout_.batch_size));
  row("params per GPU", number(double(p.params), "B"));
  row("params of model = params per GPU * mp_size", number(double(p.params) * mp, "B"));
  row("fwd MACs per GPU", number(double(p.forward.macs)) + "MACs");
  row("fwd flops per GPU", number(fwd_flops));
  row("fwd flops of model = fwd flops per GPU * mp_size", number(fwd_flops * mp));
  row("fwd latency", ms(p.forward_s));
  row("fwd FLOPS per GPU = fwd flops per GPU / fwd latency", number(ratio(fwd_flops, p.forward_s)) + "FLOPS");
  const double iteration = p.forward_s + p.backward_s + p.step_s;
  const double achieved = ratio((bwd_factor + 1) * fwd_flops, iteration);
  row("bwd latency", ms(p.backward_s));
  row(fmt("bwd FLOPS per GPU = %g * fwd flops per GPU / bwd latency", bwd_factor),
      number(ratio(bwd_factor * fwd_flops, p.backward_s)) + "FLOPS");
  row(fmt("fwd+bwd FLOPS per GPU = %g * fwd flops per GPU / (fwd+bwd latency)", bwd_factor + 1),
      number(ratio((bwd_factor + 1) * fwd_flops, p.forward_s + p.backward_s)) + "FLOPS");
  row("step latency", ms(p.step_s));
  row("iter latency", ms(iteration));
  row(fmt("FLOPS per GPU = %g * fwd flops per GPU / iter latency", bwd_factor + 1), number(achieved) + "FLOPS");
  row("samples/second", fmt("%.2f", ratio(double(layout_.batch_size) * layout_.data, iteration)));
  if (config_.peak_tflops && *config_.peak_tflops > 0)
    row(fmt("MFU = FLOPS per GPU / peak (%g TFLOPS)", *config_.peak_tflops),
        fmt("%.2f%%", 100 * achieved / (*config_.peak_tflops * 1e12)));

  // Depth 0 is the model, depth 1 its units (a C++ model's units do not nest; a model that enters
  // none, a pipeline stage, has depth 0 alone).
  out("\n-------------------------- Aggregated Profile per GPU --------------------------");
  out("Top " + std::to_string(config_.top_modules) + " modules in terms of params, MACs or fwd latency at different model depths:");
  struct Totals { double params = 0, macs = 0, latency = 0; };
  std::vector<std::map<std::string, Totals>> depths(2);
  depths[0]["model"] = Totals{double(p.params), double(p.forward.macs), p.forward_s};
  if (units_entered_)
    for (const UnitProfile& u : p.units) {
      Totals& t = depths[1][kind_of(u.name)];
      t.params += double(u.params);
      t.macs += double(u.forward.macs);
      t.latency += u.latency_s;
    }
  const int shown = config_.module_depth < 0 ? 2 : static_cast<int>(std::min<int64_t>(2, config_.module_depth + 1));
  for (int d = 0; d < shown; ++d) {
    if (depths[d].empty()) continue;
    auto top = [&](double Totals::*key, const std::function<std::string(double)>& show) {
      std::vector<std::pair<std::string, Totals>> sorted(depths[d].begin(), depths[d].end());
      std::stable_sort(sorted.begin(), sorted.end(), [&](const auto& x, const auto& y) { return x.second.*key > y.second.*key; });
      std::string s = "{";
      for (size_t i = 0; i < sorted.size() && i < size_t(config_.top_modules); ++i)
        s += (i ? ", '" : "'") + sorted[i].first + "': '" + show(sorted[i].second.*key) + "'";
      return s + "}";
    };
    out("depth " + std::to_string(d) + ":");
    out("    params      - " + top(&Totals::params, [](double v) { return number(v, "B"); }));
    out("    MACs        - " + top(&Totals::macs, [](double v) { return number(v) + "MACs"; }));
    out("    fwd latency - " + top(&Totals::latency, ms));
  }
  if (config_.detailed) {
    out("\n-------------------------- Detailed Profile per GPU --------------------------");
    out("Each module: params, percentage of total params, MACs, percentage of total MACs, fwd latency, percentage of "
        "total fwd latency, fwd FLOPS");
    auto line = [&](int depth, const std::string& name, const char* kind, int64_t params, const OpCount& c, double s) {
      char buf[512];
      std::snprintf(buf, sizeof(buf), "%*s(%s): %s(%s, %.2f%% Params, %sMACs, %.2f%% MACs, %.2f ms, %.2f%% latency, %sFLOPS)",
                    2 * depth, "", name.c_str(), kind, number(double(params), "B").c_str(),
                    100 * ratio(double(params), double(p.params)), number(double(c.macs)).c_str(),
                    100 * ratio(double(c.macs), double(p.forward.macs)), 1000 * s, 100 * ratio(s, p.forward_s),
                    number(ratio(double(c.flops), s)).c_str());
      out(buf);
    };
    line(0, "model", "Model", p.params, p.forward, p.forward_s);
    if (config_.module_depth != 0 && units_entered_) {
      OpCount outside = p.forward;
      for (const UnitProfile& u : p.units) {
        line(1, u.name, "Unit", u.params, u.forward, u.latency_s);
        outside.flops -= u.forward.flops;
        outside.macs -= u.forward.macs;
      }
      if (outside.flops > 0 && !p.units.empty()) line(1, "outside units", "Ops", 0, outside, 0.0);
    }
  }
  out(std::string(76, '-'));
  if (config_.output_file) {
    const std::filesystem::path path(*config_.output_file);
    if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text;
  } else {
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
  }
}

}  // namespace tessera
