#include "parallel/pipeline/split_backward.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

namespace tessera::pipeline {

using torch::autograd::AccumulateGrad;
using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Node;
using torch::autograd::variable_list;

namespace {

// Keeps the gradients that reach a node while B runs (not in W, which runs the node again).
struct Capture {
  bool active = true;
  std::unordered_map<Node*, variable_list> grads;
};

class CaptureHook final : public torch::autograd::FunctionPreHook {
 public:
  CaptureHook(std::shared_ptr<Capture> capture, Node* node) : capture_(std::move(capture)), node_(node) {}
  variable_list operator()(const variable_list& grads) override {
    if (capture_->active) capture_->grads[node_] = grads;
    return grads;
  }

 private:
  std::shared_ptr<Capture> capture_;
  Node* node_;
};

bool is_weight(const Node* node) { return dynamic_cast<const AccumulateGrad*>(node) != nullptr; }

}  // namespace

// A node where weights' branches leave the input's path, with the weights' accumulators they reach.
struct Junction {
  std::shared_ptr<Node> node;
  edge_list weights;
};

struct SplitBackward::State {
  std::vector<at::Tensor> outputs, grads;  // the roots, for the whole backward when not split
  std::vector<Junction> junctions;
  std::shared_ptr<Capture> capture = std::make_shared<Capture>();
  bool split = true, done = false;
};

SplitBackward::SplitBackward(std::vector<at::Tensor> outputs, std::vector<at::Tensor> grads, const at::Tensor& input)
    : state_(std::make_unique<State>()) {
  State& st = *state_;
  if (!input.is_leaf() || !input.requires_grad())
    throw std::invalid_argument("SplitBackward: the stage's input must be a leaf that requires grad");
  const Edge input_edge = torch::autograd::impl::gradient_edge(input);
  edge_list roots;
  for (const at::Tensor& out : outputs) roots.push_back(torch::autograd::impl::gradient_edge(out));

  // The graph from the outputs: every node once, children before parents in `order` (post-order).
  std::vector<Node*> order;
  std::unordered_map<Node*, std::shared_ptr<Node>> owners;
  {
    std::unordered_set<Node*> seen;
    std::vector<std::pair<Node*, size_t>> stack;
    for (const Edge& r : roots)
      if (r.function && seen.insert(r.function.get()).second) {
        owners[r.function.get()] = r.function;
        stack.push_back({r.function.get(), 0});
        while (!stack.empty()) {
          auto& [node, next] = stack.back();
          if (next < node->num_outputs()) {
            const Edge& e = node->next_edge(next++);
            if (e.function && seen.insert(e.function.get()).second) {
              owners[e.function.get()] = e.function;
              stack.push_back({e.function.get(), 0});
            }
          } else {
            order.push_back(node);
            stack.pop_back();
          }
        }
      }
  }
  // The input's path: the nodes from which the input's accumulator is reachable.
  std::unordered_set<Node*> on_path;
  for (Node* node : order) {  // children first
    bool reaches = node == input_edge.function.get();
    for (const Edge& e : node->next_edges()) reaches = reaches || (e.function && on_path.count(e.function.get()));
    if (reaches) on_path.insert(node);
  }
  // Junctions: nodes on the path with a branch off it; each branch's weights, each branch once.
  std::unordered_set<Node*> claimed;
  for (Node* node : order) {
    if (!on_path.count(node) || node == input_edge.function.get()) continue;
    Junction junction{owners[node], {}};
    std::vector<Node*> stack;
    for (const Edge& e : node->next_edges())
      if (e.function && !on_path.count(e.function.get())) {
        if (!claimed.insert(e.function.get()).second) st.split = false;  // a branch shared by two junctions
        stack.push_back(e.function.get());
      }
    if (stack.empty()) continue;
    while (!stack.empty()) {  // the branch never rejoins the path: nothing below it reaches the input
      Node* n = stack.back();
      stack.pop_back();
      if (is_weight(n)) junction.weights.push_back(Edge(owners[n], 0));
      for (const Edge& e : n->next_edges())
        if (e.function) {
          if (!claimed.insert(e.function.get()).second) st.split = false;
          stack.push_back(e.function.get());
        }
    }
    if (!junction.weights.empty()) st.junctions.push_back(std::move(junction));
  }
  if (st.split)
    for (Junction& j : st.junctions) j.node->add_pre_hook(std::make_unique<CaptureHook>(st.capture, j.node.get()));

  // B: the input's gradient only; the graph is kept for W.
  variable_list result = torch::autograd::Engine::get_default_engine().execute(
      roots, grads, /*keep_graph=*/true, /*create_graph=*/false, /*accumulate_grad=*/false, {input_edge});
  st.capture->active = false;
  input_gradient_ = result.at(0);
  if (!input_gradient_.defined())
    throw std::runtime_error("SplitBackward: the stage's output does not depend on its input: no gradient to send back");
  st.outputs = std::move(outputs);
  st.grads = std::move(grads);
}

SplitBackward::~SplitBackward() = default;
SplitBackward::SplitBackward(SplitBackward&&) noexcept = default;
SplitBackward& SplitBackward::operator=(SplitBackward&&) noexcept = default;

bool SplitBackward::split() const { return state_->split; }

void SplitBackward::weights() {
  State& st = *state_;
  if (st.done) throw std::logic_error("SplitBackward::weights() ran twice");
  st.done = true;
  if (!st.split) {
    torch::autograd::backward(st.outputs, st.grads);
  } else {
    // One pass per junction: seeded there, pruned to its own weights (a pass seeded at several
    // junctions would also carry one junction's gradient down the path into the next).
    for (Junction& j : st.junctions) {
      auto it = st.capture->grads.find(j.node.get());
      if (it == st.capture->grads.end()) continue;  // B never reached it (no gradient flowed there)
      edge_list roots;
      for (uint32_t i = 0; i < j.node->num_inputs(); ++i) roots.emplace_back(j.node, i);
      torch::autograd::Engine::get_default_engine().execute(roots, it->second, /*keep_graph=*/false,
                                                            /*create_graph=*/false, /*accumulate_grad=*/true, j.weights);
    }
  }
  st = State{};  // the graph and the kept gradients go
  st.done = true;
}

}  // namespace tessera::pipeline
