#include "parallel/activation_checkpointing.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/core/ivalue.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <atomic>
#include <optional>

#include "parallel/communicator.h"
#include "parallel/tensor_parallel/regions.h"

namespace tessera {

namespace {

std::atomic<int64_t> recomputations{0};

// The default generators of the devices a checkpoint draws from: the CPU's, and the current
// GPU's when there is one.
std::vector<at::Generator> generators(const std::vector<at::Tensor>& inputs) {
  std::vector<at::Generator> out{at::globalContext().defaultGenerator(c10::Device(c10::kCPU))};
  for (const at::Tensor& t : inputs)
    if (t.defined() && t.is_cuda()) {
      out.push_back(at::globalContext().defaultGenerator(t.device()));
      break;
    }
  return out;
}

std::vector<at::Tensor> states_of(const std::vector<at::Generator>& gens) {
  std::vector<at::Tensor> s;
  for (const at::Generator& g : gens) s.push_back(g.get_state());
  return s;
}

void set_states(std::vector<at::Generator>& gens, const std::vector<at::Tensor>& states) {
  for (size_t i = 0; i < gens.size(); ++i) gens[i].set_state(states[i]);
}

// What a checkpoint keeps between its forward and backward, beyond the saved tensors.
struct CheckpointState : torch::CustomClassHolder {
  CheckpointedFunction fn;
  CheckpointOptions options;
  std::vector<at::Generator> gens;
  std::vector<at::Tensor> rng;           // the generators' states before the forward
  std::vector<std::vector<int64_t>> shapes;
  std::vector<bool> partitioned, requires_grad;
  std::vector<c10::Device> devices;
};

// An input that requires grad, so the outputs do (the parameters fn reads are not inputs).
const at::Tensor& always_requires_grad() {
  static const at::Tensor t = at::empty({0}).set_requires_grad(true);
  return t;
}

struct Checkpoint : torch::autograd::Function<Checkpoint> {
  // `all` is a TensorList, not a vector: autograd counts a vector argument as one non-tensor.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::TensorList all,
                                                c10::intrusive_ptr<CheckpointState> state) {
    std::vector<at::Tensor> inputs(all.begin(), all.end() - 1);  // without always_requires_grad()
    state->gens = generators(inputs);
    state->rng = states_of(state->gens);
    std::vector<at::Tensor> outputs;
    {
      at::NoGradGuard no_grad;
      outputs = state->fn(inputs);
    }
    Communicator* group = state->options.partition_over;
    std::vector<at::Tensor> kept;
    for (const at::Tensor& x : inputs) {
      at::Tensor k = x.detach();
      const bool split = group && group->size() > 1 && k.numel() >= group->size() && k.numel() % group->size() == 0;
      state->shapes.push_back(k.sizes().vec());
      state->devices.push_back(k.device());
      state->requires_grad.push_back(x.requires_grad());
      state->partitioned.push_back(split);
      if (split) k = k.reshape({-1}).chunk(group->size())[group->rank()].clone();  // the whole input may go
      if (state->options.cpu && !k.is_cpu()) k = k.to(at::kCPU);
      kept.push_back(k);
    }
    ctx->save_for_backward(kept);
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto state = c10::static_intrusive_pointer_cast<CheckpointState>(ctx->saved_data["state"].toCapsule());
    std::vector<at::Tensor> kept = ctx->get_saved_variables();
    std::vector<at::Tensor> inputs;
    for (size_t i = 0; i < kept.size(); ++i) {
      at::Tensor x = kept[i].to(state->devices[i]);
      if (state->partitioned[i]) x = all_gather_along(x, *state->options.partition_over, 0);
      inputs.push_back(x.view(state->shapes[i]).detach().set_requires_grad(state->requires_grad[i]));
    }
    const std::vector<at::Tensor> current = states_of(state->gens);
    set_states(state->gens, state->rng);  // the forward's random draws again
    std::vector<at::Tensor> outputs;
    try {
      at::AutoGradMode grad_on(true);
      outputs = state->fn(inputs);
    } catch (...) {
      set_states(state->gens, current);
      throw;
    }
    set_states(state->gens, current);
    std::vector<at::Tensor> with_grad, their_grads;
    for (size_t i = 0; i < outputs.size() && i < grads.size(); ++i)
      if (outputs[i].defined() && outputs[i].requires_grad() && grads[i].defined()) {
        with_grad.push_back(outputs[i]);
        their_grads.push_back(grads[i]);
      }
    if (!with_grad.empty()) torch::autograd::backward(with_grad, their_grads);
    ++recomputations;
    torch::autograd::variable_list out;
    for (const at::Tensor& x : inputs) out.push_back(x.requires_grad() ? x.grad() : at::Tensor());
    out.push_back(at::Tensor());  // always_requires_grad()
    out.push_back(at::Tensor());  // the state
    return out;
  }
};

}  // namespace

std::vector<at::Tensor> checkpoint(CheckpointedFunction fn, const std::vector<at::Tensor>& inputs,
                                   const CheckpointOptions& options) {
  auto state = c10::make_intrusive<CheckpointState>();
  state->fn = std::move(fn);
  state->options = options;
  std::vector<at::Tensor> all = inputs;
  all.push_back(always_requires_grad());
  return Checkpoint::apply(at::TensorList(all), state);
}

int64_t checkpoint_recomputations() { return recomputations.load(); }

}  // namespace tessera
