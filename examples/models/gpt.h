// A GPT-2-style byte-level language model written directly with ATen ops (no torch::nn), sized to
// train on a CPU in minutes and to exercise the engine: every parameter is a plain leaf tensor the
// engine can re-point into its flat buffers.
//
//   token embedding (vocab × n_embd) + learned position embedding (block_size × n_embd)
//   n_layer × pre-LayerNorm block:
//       x += c_proj(causal_self_attention(c_attn(ln_1(x))))      scaled_dot_product_attention
//       x += c_proj(gelu_tanh(c_fc(ln_2(x))))                     MLP 4×
//   ln_f, then the LM head TIED to the token embedding (logits = x · wteᵀ), as in GPT-2/nanoGPT
//   loss: cross-entropy, computed in fp32 whatever the parameter dtype
//
// Parameters are read from `parameters()` at every forward, never from copies taken at
// construction: the engine may re-point each tensor (`set_`) into its flat buffer, or replace the
// tensors in the vector returned by reference (to change their dtype to bf16 or their device).
// Activations follow the parameters' dtype and device; inputs are moved to the parameters' device.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"  // ModelDescription
#include "parallel/activation_checkpointing.h"
#include "parallel/moe/gating.h"
#include "parallel/pipeline/partition.h"
#include "zero/partitioned_init.h"

namespace tessera {
class Communicator;
}

namespace tessera::examples {

struct GptConfig {
  int64_t vocab = 256;
  int64_t block_size = 128;
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
};

// Tensor parallelism (parallel/tensor_parallel/layers.h) over `tensor` (null or one rank: none):
// the token embedding and the tied head split by vocabulary (vocab-parallel cross-entropy), each
// block's c_attn (q|k|v blocks each split) and c_fc by rows, both c_proj by columns; with
// `sequence_parallel`, activations between them split along the sequence.
struct GptTensorParallel {
  Communicator* tensor = nullptr;
  bool sequence_parallel = false;
};

// Mixture-of-Experts blocks (engine/config's MoeConfig; parallel/moe/): block l is one when
// (l + 1) % every == 0; its MLP becomes a router ("mlp.router.weight", E × C)
// and E experts, each the dense MLP's shape ("mlp.experts.<e>.c_fc.weight", ...), spread over the
// `expert_parallel` group (ep_size ranks; this rank holds num_experts / ep_size of them). Every rank
// draws every expert's initial values in the same order and keeps its own, so the model equals the
// one-rank model at any ep_size. The experts are replicated over the tensor group (under sequence
// parallelism their gradients are summed over it, as a LayerNorm's).
struct GptMoe {
  std::optional<MoeConfig> config;          // absent: a dense model
  Communicator* expert_parallel = nullptr;  // the ep_size ranks that exchange tokens (null: ep_size 1)
  std::string expert_data;  // the experts' ParamGroup::communicator ("" with ep_size 1: the data group)
};

// Context parallelism (parallel/context_parallel/) over `context` (null or one rank: none): each
// rank holds a part of every sequence (contiguous for "ulysses", chunks r and 2N−1−r of 2N for
// "ring"), its positions the global ones; attention runs across the group (Ulysses's all-to-alls
// around SDPA, or ring attention), and loss() is the mean over the whole sequence's tokens. Under
// Ulysses the heads (after tensor parallelism) must divide by the group's size.
struct GptContextParallel {
  Communicator* context = nullptr;
  std::string method = "ulysses";
};

class Gpt {
 public:
  // Deterministic initialization from `seed` (GPT-2's): linear and embedding weights N(0, 0.02),
  // the residual projections (attn.c_proj, mlp.c_proj) N(0, 0.02/sqrt(2·n_layer)), biases 0,
  // LayerNorm weight 1 and bias 0. Every rank building with the same seed gets the same model.
  // With `init` (ZeRO-3, zero/partitioned_init.h) the embeddings, each block and the final norm are
  // partitioned as soon as they are drawn: no rank holds the whole model (the same values).
  // With tensor parallelism each rank holds its slices of the same draws: the model equals the
  // single-device one split (n_head, 4·n_embd and vocab must divide by the degree).
  Gpt(GptConfig config, uint64_t seed, PartitionedInit* init = nullptr, GptTensorParallel tp = {}, GptMoe moe = {},
      GptContextParallel cp = {});

  const GptConfig& config() const { return config_; }
  // The parameters, in a fixed order; leaf tensors with requires_grad. The engine may replace them.
  std::vector<at::Tensor>& parameters() { return params_; }
  const std::vector<at::Tensor>& parameters() const { return params_; }
  // nanoGPT's names, same order: "transformer.wte.weight", "transformer.h.0.ln_1.weight", ...
  std::vector<std::string> parameter_names() const { return names_; }
  int64_t num_parameters() const;
  // The single-device values of every parameter, same order: tensor-parallel slices gathered from
  // the tensor group (a collective every tensor rank calls; at ZeRO-3 inside the engine's
  // gathered_parameters() scope, so that each rank's slices are whole first). Another pipeline
  // stage's parameters (keep_only_layers) come back uninitialized, in their whole shape.
  std::vector<at::Tensor> full_parameters() const;

  bool is_moe_block(int64_t l) const { return moe_.config && (l + 1) % moe_.config->every == 0; }
  // The MoE blocks of the last forward: their load-balancing losses l_aux summed over the blocks
  // (loss() includes aux_loss_coef times it), and the choices routed and dropped by the capacity.
  double last_aux_loss() const { return l_aux_.defined() ? l_aux_.item<double>() : 0.0; }
  int64_t last_routed() const { return routed_; }
  // A pipeline stage: the MoE blocks' losses of the forward just run (aux_loss_coef times l_aux),
  // with their graph, taken (undefined when the stage has no MoE block); its loss() leaves them out.
  at::Tensor take_aux_loss() { return std::exchange(aux_, at::Tensor()); }
  int64_t last_dropped() const { return dropped_; }

  // Each block's activations recomputed in backward (parallel/activation_checkpointing.h), or not.
  void set_activation_checkpointing(std::optional<CheckpointOptions> options) { checkpointing_ = options; }

  // From now on each forward reports its units to `engine` (Engine::unit): the embedding, each
  // block, the head (see param_groups). nullptr detaches.
  void attach(Engine* engine) { engine_ = engine; }

  // idx: int64 [B, T] with T <= block_size (context-parallel: this rank's part of sequences of
  // T·N <= block_size tokens). Returns logits [B, T, vocab] in the parameters' dtype
  // (tensor-parallel: this rank's [B, T, vocab / t]).
  at::Tensor forward(const at::Tensor& idx);
  // Mean cross-entropy over B·T positions (context-parallel: over the whole sequences'), fp32 scalar.
  at::Tensor loss(const at::Tensor& idx, const at::Tensor& targets);
  at::Tensor loss_of_logits(const at::Tensor& logits, const at::Tensor& targets) const;

  // The model as an ordered list of layers, for pipeline stages (parallel/pipeline/partition.h):
  // 0 the embedding (wte, wpe), 1 ... n_layer the blocks, n_layer + 1 the head (ln_f and the tied
  // wte). forward(idx) is forward_layers(idx, 0, num_layers()); a stage runs its own range, from
  // the token ids (begin 0) or the previous stage's hidden states.
  int64_t num_layers() const { return config_.n_layer + 2; }
  at::Tensor forward_layers(const at::Tensor& input, int64_t begin, int64_t end);
  std::vector<pipeline::LayerInfo> layer_infos() const;
  // Layer ranges [begin, end): a pipeline stage's (interleaved schedules give a rank several,
  // pipeline/partition.h's stage_layer_ranges).
  using LayerRanges = std::vector<std::pair<int, int>>;
  // The indices in parameters() of the ranges' layers' parameters, each once.
  std::vector<int64_t> parameters_of_layers(const LayerRanges& ranges) const;
  // The same layers' indices in full_parameters() (every expert of their MoE blocks included).
  std::vector<int64_t> full_parameters_of_layers(const LayerRanges& ranges) const;
  // A pipeline stage: every parameter outside the ranges becomes a meta tensor (its shape, no
  // memory), so a rank holds only its stage. whole_shape(i) is parameter i's single-device shape.
  void keep_only_layers(const LayerRanges& ranges);
  std::vector<int64_t> whole_shape(int64_t i) const;
  // The ranges' parameters in optimizer groups as param_groups() makes them, with the tied wte in
  // a group of its own ("tied", last) when `separate_wte` (it is then summed with the other
  // stage's copy); no units (a stage reports none).
  ModelDescription stage_param_groups(double weight_decay, const LayerRanges& ranges, bool separate_wte) const;

  // Two groups, as nanoGPT's configure_optimizers: "decay" (every parameter with dim >= 2: the
  // linear weights and both embeddings) with `weight_decay`, "no_decay" (biases, LayerNorm) with 0;
  // and the units, in forward order: "embedding" (wte, wpe), "h.0" ... "h.<n-1>", "head" (ln_f and
  // the tied wte, which the embedding owns).
  ModelDescription param_groups(double weight_decay) const;

 private:
  int64_t add(const std::string& name, at::Tensor value, TensorSplit split = {});
  int64_t tp_ranks() const;
  int64_t cp_ranks() const;
  at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const;  // [B, heads, T, D]
  at::Tensor replicated(const at::Tensor& w) const;  // under sequence parallelism: its gradient summed over the group
  at::Tensor block(int64_t l, const at::Tensor& x) const;  // block l's forward
  at::Tensor moe_mlp(int64_t l, const at::Tensor& h) const;  // an MoE block's MLP
  void add_moe_parameters(const std::string& prefix, const std::function<at::Tensor(std::vector<int64_t>, double)>& normal,
                          double residual_std);
  std::vector<int64_t> layer_parameters(int64_t layer) const;  // indices into params_
  ModelDescription groups_of(const std::vector<int64_t>& indices, double weight_decay) const;
  std::optional<CheckpointOptions> checkpointing_;

  GptConfig config_;
  GptTensorParallel tp_;
  GptContextParallel cp_;
  std::vector<TensorSplit> splits_;  // per parameter
  Engine* engine_ = nullptr;
  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  int64_t wte_ = -1, wpe_ = -1, ln_f_ = -1;
  std::vector<int64_t> block_;  // index of each block's first parameter (ln_1.weight); 12 per block
  // MoE blocks: the 8 attention and norm parameters, then the router and each local expert's 4
  // (c_fc weight and bias, c_proj weight and bias) where a dense block has its MLP's 4.
  GptMoe moe_;
  GateOptions gate_;          // the router's options, from moe_.config
  std::vector<bool> expert_;  // per parameter: an expert's (partitioned and reduced over expert_data)
  mutable at::Tensor aux_;    // the last forward's auxiliary losses times their coefficient, with their graph
  mutable at::Tensor l_aux_;  // ... their sum alone, without a graph (for the progress line)
  mutable int64_t routed_ = 0, dropped_ = 0;
};

}  // namespace tessera::examples
