// Transformer shapes for the memory estimator (engine/estimator/estimator.h): the named presets, the
// parameter tensors a shape has (in registration order, the order the engine lays them out in),
// and the parameter counts derived from them. Pure arithmetic; docs/estimator.md states the
// formulas.
//
//   parameters = embeddings + layers × (attention + MLP + norms) + final norm (+ LM head if untied)
//     embeddings  vocab·h (+ max_positions·h for learned positions, GPT-2)
//     attention   h·(h + 2·kv) for Q, K, V (kv = kv_heads·h/heads) + h·h output (+ biases h + 2·kv, h)
//     MLP         GELU: 2·h·ffn (+ biases ffn, h); SwiGLU: 3·h·ffn (gate, up, down)
//     norms       2 per layer and 1 final: h each (+ h bias for LayerNorm, not for RMSNorm)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tessera {

struct TransformerShape {
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;       // 0: = heads (multi-head attention); fewer: grouped-query attention
  int64_t ffn = 0;            // MLP inner size; 0: 4·hidden
  int64_t vocab = 0;
  int64_t seq_len = 0;        // training sequence length
  int64_t max_positions = 0;  // learned position embeddings (GPT-2); 0: none (rotary, Llama)
  std::string mlp = "gelu";   // "gelu": fc + proj; "swiglu": gate, up, down (3 matrices)
  std::string norm = "layernorm";  // "layernorm" (weight, bias) | "rmsnorm" (weight)
  bool biases = true;              // linear layers carry biases (GPT-2) or not (Llama)
  bool tied_embeddings = true;     // LM head shares the token embedding (GPT-2) or has its own (Llama)
  bool dropout = true;             // dropout layers (their 1-byte masks are stored activations)
  bool flash_attention = false;    // the preset's own note only: the estimate follows TrainingSetup::attention (sdpa by default)

  int64_t kv_dim() const { return (kv_heads > 0 ? kv_heads : heads) * (hidden / (heads > 0 ? heads : 1)); }
  int64_t ffn_dim() const { return ffn > 0 ? ffn : 4 * hidden; }
  // Throws std::invalid_argument naming the first bad field.
  void validate() const;
};

// One parameter tensor of a model, as the estimator sees it.
struct ParamTensor {
  std::string name;
  int64_t numel = 0;
  int group = 0;          // parameter group: the engine keeps one flat buffer per group
  int layer = -1;         // transformer layer; -1: before the layers (embeddings); -2: after (final norm, head)
  int module = -1;        // tensors of one module (a Linear's weight and bias) share an id; ZeRO-3 gathers per module
  bool tp_split = false;  // divided by the tensor-parallel degree (column/row-parallel weights, vocab-parallel
                          // embedding); false: replicated on every tensor-parallel rank (norms, row-parallel biases)
  bool tied_copy = false; // the LM head's copy of a tied embedding, held by the last pipeline stage only when pp > 1
  int expert = -1;        // an MoE layer's expert e (0..E-1): held by the ep rank of e, in groups 2-3 (over dp/ep)
};

struct MoeConfig;

// The parameters of `shape` in registration order (GPT-2's order for "gelu", Llama's for "swiglu").
// Group 0: matrices and embeddings (weight decay), group 1: vectors (biases, norms), as
// tessera's examples and nanoGPT group them. Includes a `tied_copy` LM head when tied. With `moe`
// (engine/config's section), layer l with (l + 1) % every == 0 has a router (E × hidden, group 0)
// and E experts of the MLP's shape in place of the MLP: their matrices in group 2, vectors in 3
// (the example GPT's "experts.decay" and "experts.no_decay"), replicated over tensor parallelism.
std::vector<ParamTensor> transformer_tensors(const TransformerShape& shape, const MoeConfig* moe = nullptr);

// Sum of the tensors' sizes, tied copies excluded: the model's parameter count.
int64_t param_count(const std::vector<ParamTensor>& tensors);
// The largest module's parameter count (DeepSpeed's "largest layer"; ZeRO-3 gathers a module whole).
int64_t largest_module_params(const std::vector<ParamTensor>& tensors);

struct ModelPreset {
  std::string name;
  std::string description;
  TransformerShape shape;
};

// gpt2-small/medium/large/xl, llama-7b/13b/70b, tessera-gpt (examples/models/gpt.h's default).
const std::vector<ModelPreset>& model_presets();
std::optional<ModelPreset> find_preset(const std::string& name);

}  // namespace tessera
